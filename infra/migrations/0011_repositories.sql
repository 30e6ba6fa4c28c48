-- 0011: the right machine for the repository.

-- What a machine has, as its orchestrator said last (`POST /machine`, on every start): the
-- repositories checked out on it (display form, and the lower-case `host/owner/name` keys routing
-- compares) and its labels (lower case). A table of its own: the hot statements read the
-- machine's row by key (an enqueue locks it, a poll marks it seen), and a wider row changed their
-- generic plans on a small table that has not been analysed yet.
CREATE TABLE IF NOT EXISTS machine_inventories (
    orchestrator_id  uuid PRIMARY KEY REFERENCES orchestrators (id),
    repositories     jsonb NOT NULL DEFAULT '[]',
    repository_keys  text[] NOT NULL DEFAULT '{}',
    labels           text[] NOT NULL DEFAULT '{}',
    updated_at       timestamptz NOT NULL DEFAULT now()
);
-- A digest of a machine's repositories and labels ('' for a machine that said nothing), on the
-- machine's own row: the webhook's one statement compares the digests of a user's machines in the
-- index scan that chooses among them, so a user whose machines all have the same (one machine, or
-- all alike) stays on that statement, and any other start is routed after commit, once Linear has
-- been asked which repository it needs.
ALTER TABLE orchestrators ADD COLUMN IF NOT EXISTS routing_shape text NOT NULL DEFAULT '';

-- A routing request may need the repository (the user is known; which of their machines has the
-- repository the issue is about). `linear_user_id`: whose machines (null while the assignee is
-- still to be asked). While the person is asked to pick (`asked_at`), the request is open but not
-- due (available_at = infinity); the candidates asked about are kept, and the answer (`choice`)
-- makes it due again.
ALTER TABLE routing_requests DROP CONSTRAINT IF EXISTS routing_requests_need_check;
ALTER TABLE routing_requests ADD CONSTRAINT routing_requests_need_check
    CHECK (need IN ('assignee', 'repository'));
ALTER TABLE routing_requests ADD COLUMN IF NOT EXISTS linear_user_id text;
ALTER TABLE routing_requests ADD COLUMN IF NOT EXISTS asked_at timestamptz;
ALTER TABLE routing_requests ADD COLUMN IF NOT EXISTS candidates jsonb;
ALTER TABLE routing_requests ADD COLUMN IF NOT EXISTS choice text;

-- How a session's machine was chosen, when it took more than the user's most recently seen machine
-- (the repository and why; or that Linear could not be asked and it was routed as without
-- repositories): for the session's page.
ALTER TABLE dispatch_sessions ADD COLUMN IF NOT EXISTS routing_note text;
