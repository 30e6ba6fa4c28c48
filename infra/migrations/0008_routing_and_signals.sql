-- 0008: routing that must ask Linear first, and Linear's signals on the agent's activities.

-- A start (or a follow-up queued behind one) that cannot be routed inside the webhook's
-- transaction, because Linear must be asked something first: an agent session started by an
-- automation has no creator, and Linear's webhook issue object carries no assignee. The request is
-- written in the webhook's transaction (so the session is never lost), and the Linear read and the
-- routing happen after commit, retried with the sweep's backoff until Linear answers. A request is
-- done once (`done_at`, a compare-and-set) in the transaction that queues its message or tells
-- Linear why nothing can take it.
CREATE TABLE IF NOT EXISTS routing_requests (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    org_id           text NOT NULL,
    agent_session_id text,
    issue_id         text NOT NULL,
    -- what must be learned from Linear before the message can be routed
    need             text NOT NULL CHECK (need IN ('assignee')),
    -- the message to queue once routed (a DispatchPayload, as dispatch_queue.payload)
    message          jsonb NOT NULL,
    -- the webhook delivery that asked for it: recorded as dispatched to the session it becomes
    delivery_key     text,
    attempts         integer NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    done_at          timestamptz,
    -- dispatched | no_assignee | no_machine | not_connected | cancelled | gave_up
    outcome          text,
    session_id       uuid
);
-- Serves taking due requests (the sweep, and the send right after commit).
CREATE INDEX IF NOT EXISTS routing_requests_due_idx
    ON routing_requests (available_at) WHERE done_at IS NULL;
-- Serves the order rule (one agent session's requests are routed in the order they were written)
-- and a stop's cancellation of the agent session's open requests.
CREATE INDEX IF NOT EXISTS routing_requests_agent_idx
    ON routing_requests (org_id, agent_session_id, seq) WHERE done_at IS NULL;

-- The agent's elicitations carry Linear's signals (`select` with its options, `auth` with a URL).
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS signal text
    CHECK (signal IS NULL OR signal IN ('select', 'auth', 'continue', 'stop'));
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS signal_metadata jsonb;

-- Serves an agent session's whole conversation as posted to Linear, in order (the machine's
-- transcript, `GET /activities`).
CREATE INDEX IF NOT EXISTS linear_notices_agent_session_idx
    ON linear_notices (org_id, agent_session_id, seq) WHERE agent_session_id IS NOT NULL;
