-- 0021: Linear's rate limit is a wait, never a loss; a replaced ephemeral post is not sent; and
-- finished conversations are forgotten after DEVPILOT_RETENTION_DAYS.
--
-- Locks: `ALTER TABLE linear_notices ADD COLUMN` (nullable, no default: the catalog only) takes the
-- table's ACCESS EXCLUSIVE lock for about a millisecond, whatever its size (measured at 0 and at
-- 2,000,000 posts: bench/README.md); every statement here waits at most 200 ms for a lock and the
-- file is tried again (shared/migrate.py), so a long transaction on the table delays the service's
-- writes by that much at a time, never by its whole length. Nothing else here touches a table
-- that grows.

-- Each workspace's pace with Linear: when Linear refuses a post for its rate limit (`RATELIMITED`),
-- no post of the org is sent before `blocked_until` (the reset Linear gave), whatever instance
-- sends it; the refusal is not an attempt. Written in the statement that puts the refused post
-- back (`notice_ratelimited`), read by every take of the outbox and of the router.
CREATE TABLE IF NOT EXISTS linear_paces (
    org_id          text PRIMARY KEY,
    blocked_until   timestamptz NOT NULL,
    refusals        bigint NOT NULL DEFAULT 0,   -- RATELIMITED answers so far (/metrics counts them)
    last_refused_at timestamptz,
    budget          text                          -- which of Linear's budgets ran out, as it said
);

-- An `ephemeral` activity still unsent when the agent's next post of the same agent session is
-- accepted is not sent: Linear would replace it at once. It is kept, marked (the page says
-- "replaced before it was sent"), and holds nothing back (available_at = infinity).
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS superseded_by uuid;

-- A conversation's keep lock: a machine's post in an agent session takes it shared (posts never
-- wait for each other), the retention sweep exclusively, without waiting, before it forgets the
-- conversation. So a post accepted into a conversation is never left behind by its forgetting: it
-- is accepted before (and the conversation is live again), or refused after (404, as any post to
-- an agent session the machine does not hold).
CREATE OR REPLACE FUNCTION devpilot_conversation_key(org text, conversation text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(org || '/kept/' || conversation, 0);

-- May this machine post in this agent session: a message of it was delivered to the machine, or
-- (`alias_of`) it names a plain assignment delivered to it (`devpilot:<sessionId>`). Takes the keep
-- lock first, shared; VOLATILE PL/pgSQL as `devpilot_agent_session_holder` (0013): its queries take
-- a snapshot after the lock was granted, so a conversation forgotten meanwhile is seen gone.
CREATE OR REPLACE FUNCTION devpilot_may_speak(org text, agent_session text, machine uuid, alias_of uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(devpilot_conversation_key(org, agent_session));
    RETURN EXISTS (
               SELECT 1 FROM dispatch_sessions s
               WHERE s.org_id = org AND s.agent_session_id = agent_session
                 AND s.orchestrator_id = machine AND s.status = 'delivered')
        OR (alias_of IS NOT NULL AND EXISTS (
               SELECT 1 FROM dispatch_sessions s
               WHERE s.id = alias_of AND s.org_id = org AND s.orchestrator_id = machine
                 AND s.status = 'delivered'));
END
$$;

-- Where the retention sweep's walks stopped: one per place it walks (the finished sessions of each
-- status by their last change, the posts and the routing requests by their age), so that a
-- conversation kept (live) does not stop the walk behind it; each walk starts again from the
-- beginning once it reaches the cutoff.
CREATE TABLE IF NOT EXISTS retention_cursors (
    walk    text PRIMARY KEY CHECK (walk IN ('delivered', 'failed', 'cancelled', 'posts', 'routing')),
    at      timestamptz NOT NULL DEFAULT '-infinity',
    id      uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000'
);
INSERT INTO retention_cursors (walk)
VALUES ('delivered'), ('failed'), ('cancelled'), ('posts'), ('routing')
ON CONFLICT (walk) DO NOTHING;
