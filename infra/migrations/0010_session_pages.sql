-- 0010: Linear kept informed beyond activities, a page per session, and operators' actions.

-- The app user's id in each workspace connected with OAuth (`viewer { id }` on the app's token,
-- learned once at install): the delegate the app sets on an issue it works on that has none.
ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS app_user_id text;

-- The outbox carries Linear's other mutations too, each a row written in the transaction that
-- decides it, posted after commit, retried by the sweep:
--   issue_started   move the issue to its team's first `started` state (read first: unless it is
--                   started, completed or canceled already)
--   delegate        set the app as the issue's delegate (read first: only when it has none)
--   external_urls   the agent session's link to its page here (agentSessionUpdate)
--   plan            the agent's plan (agentSessionUpdate)
--   session_create  an agent session of its own for a plain assignment (agentSessionCreateOnIssue);
--                   until Linear answers, the posts of that conversation carry the alias
--                   `devpilot:<sessionId>` and wait behind it
ALTER TABLE linear_notices DROP CONSTRAINT IF EXISTS linear_notices_kind_check;
ALTER TABLE linear_notices ADD CONSTRAINT linear_notices_kind_check
    CHECK (kind IN ('dispatched', 'delivered', 'failed', 'stopped', 'activity', 'issue_started',
                    'delegate', 'external_urls', 'plan', 'session_create'));
-- Serves the page's list of what was posted about a session's issue outside its agent session
-- (the issue's state and delegate).
CREATE INDEX IF NOT EXISTS linear_notices_session_idx ON linear_notices (session_id) WHERE session_id IS NOT NULL;

-- A session whose agent session the service opened itself (a plain assignment): it stays a plain
-- assignment for Linear's re-assignments (cancelled when the issue changes hands), while its
-- agent session's follow-ups and stop reach it as for a delegation.
ALTER TABLE dispatch_sessions ADD COLUMN IF NOT EXISTS agent_session_created boolean NOT NULL DEFAULT false;
-- When the claim that delivered it was made (the queue row, which held it, is gone after the ack).
ALTER TABLE dispatch_sessions ADD COLUMN IF NOT EXISTS claimed_at timestamptz;

-- Serves the search by issue identifier.
CREATE INDEX IF NOT EXISTS dispatch_sessions_identifier_idx
    ON dispatch_sessions (upper(issue_identifier), created_at DESC) WHERE issue_identifier IS NOT NULL;

-- Each claim that ended without an ack (released, or its lease expired), kept for the page; the
-- claim that delivered is the session's own `claimed_at` / `delivered_at`.
CREATE TABLE IF NOT EXISTS dispatch_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id  uuid NOT NULL REFERENCES dispatch_sessions (id),
    attempt     integer NOT NULL,
    claimed_at  timestamptz,
    ended_at    timestamptz NOT NULL DEFAULT now(),
    error       text
);
CREATE INDEX IF NOT EXISTS dispatch_attempts_session_idx ON dispatch_attempts (session_id, id);

-- The message of a dead-lettered session (its queue row is deleted), kept so an operator can queue
-- it again: the same message, a new queue row, attempts from 0.
CREATE TABLE IF NOT EXISTS dead_letters (
    session_id  uuid PRIMARY KEY REFERENCES dispatch_sessions (id),
    payload     jsonb NOT NULL,
    attempts    integer NOT NULL,
    reason      text,
    failed_at   timestamptz NOT NULL DEFAULT now()
);

-- Operators' actions on sessions (retry, cancel, move): who, when, what.
CREATE TABLE IF NOT EXISTS session_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id  uuid NOT NULL REFERENCES dispatch_sessions (id),
    action      text NOT NULL CHECK (action IN ('retry', 'cancel', 'move')),
    actor       text NOT NULL,
    detail      text NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS session_actions_session_idx ON session_actions (session_id, id);

-- The order rule of the outbox is per agent session and lane: a post is not sent while an earlier
-- unsent post of its agent session and lane is waiting. Activities are one lane (the conversation
-- Linear shows, in order); the plan is another (a newer plan never overwritten by an older one);
-- the session's link a third. So a refused link or plan is retried without holding back what the
-- agent says. An agent session devpilot is still opening (`session_create`) holds back every lane.
CREATE OR REPLACE FUNCTION devpilot_notice_lane(kind text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE kind WHEN 'plan' THEN 'plan' WHEN 'external_urls' THEN 'link' ELSE 'talk' END $$;
