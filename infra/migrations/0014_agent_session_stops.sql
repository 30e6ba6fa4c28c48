-- 0014: an agent session `created` after its stop, or after its start, starts nothing.
--
-- Linear sends an agent session's events as the person acts, but they can reach us out of order: a
-- `created` whose first delivery failed comes again a minute or an hour later, and two instances of
-- the service each order only their own webhooks. A stop (or a follow-up) handled before its
-- `created` then found nothing to stop (or started the conversation itself), and the late `created`
-- would start the agent after all: working on an issue the person had stopped, or a second time.

-- The agent sessions stopped in Linear, whatever the stop found: what a later `created` checks.
-- Written by the stop's intake transaction; forgotten with the delivery records
-- (`prune_deliveries`), long after Linear's last retry of the `created`.
CREATE TABLE IF NOT EXISTS agent_session_stops (
    org_id              text NOT NULL,
    agent_session_id    text NOT NULL,
    stopped_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, agent_session_id)
);
-- Serves the pruning, oldest first.
CREATE INDEX IF NOT EXISTS agent_session_stops_stopped_idx ON agent_session_stops (stopped_at);

-- Why an agent session `created` may not start, with its turn held: NULL when it may (no message of
-- it was ever queued or is waiting to be routed, and it was never stopped); 'started' when a message
-- of it was (a start, or a follow-up that arrived first and started it: even cancelled or failed
-- since), 'stopped' when it was stopped; 'turn_taken' when another transaction has its turn (only
-- without `wait`).
--
-- It takes the agent session's turn first (`wait`: waiting for it; else trying, and answering
-- 'turn_taken' when another transaction has it; a transaction's advisory locks are re-entrant, so
-- the intake transaction, which took it already, always has it). VOLATILE and PL/pgSQL, as
-- `devpilot_agent_session_holder` (0013): its queries run with a snapshot taken after the turn
-- was granted, so a stop or a follow-up committed by the turn's previous holder is seen even by a
-- statement whose own snapshot is older than the lock. It reads dispatch_sessions_agent_idx,
-- routing_requests_agent_idx and the stops' primary key.
CREATE OR REPLACE FUNCTION devpilot_agent_session_seen(org text, agent_session text, wait boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF wait THEN
        PERFORM pg_advisory_xact_lock(devpilot_agent_session_turn_key(org, agent_session));
    ELSIF NOT pg_try_advisory_xact_lock(devpilot_agent_session_turn_key(org, agent_session)) THEN
        RETURN 'turn_taken';
    END IF;
    IF EXISTS (SELECT FROM agent_session_stops st WHERE st.org_id = org AND st.agent_session_id = agent_session) THEN
        RETURN 'stopped';
    END IF;
    IF EXISTS (SELECT FROM dispatch_sessions s WHERE s.org_id = org AND s.agent_session_id = agent_session) THEN
        RETURN 'started';
    END IF;
    -- (a follow-up of a session an automation started, still waiting for Linear to name its machine)
    IF EXISTS (SELECT FROM routing_requests r
               WHERE r.org_id = org AND r.agent_session_id = agent_session AND r.done_at IS NULL) THEN
        RETURN 'started';
    END IF;
    RETURN NULL;
END
$$;
