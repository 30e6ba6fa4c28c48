-- 0013: an agent session's turn, for the statements that take it without waiting.
--
-- The intake transaction takes an agent session's turn waiting (`agent_session_turn`). Two
-- statements that are transactions of their own try it without waiting: the group commit of agent
-- sessions `created` together (`route_and_start_agent_sessions_many_for_delivery`) and a follow-up
-- for the machine that holds its agent session (`prompt_holders_for_delivery`). All of them must
-- lock the same key: it is written here once. (The value is the one the earlier inline expression
-- computed, so a service still running the code before this migration takes the same turns.)
CREATE OR REPLACE FUNCTION devpilot_agent_session_turn_key(org text, agent_session text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(org || '/' || agent_session, 0);

-- The machine that holds an agent session: the active orchestrator its most recent message went to
-- (with `delivered_only`, its most recent delivered message), and the issue it is about. A message
-- that was cancelled or failed before delivery gave no machine the conversation: with nothing
-- else queued or delivered, nobody holds it, and a follow-up starts it afresh. `opened_for`: when
-- devpilot opened the agent session for a plain assignment, that assignment's session (its
-- machine knows the conversation as `devpilot:<it>`).
--
-- Read only with the agent session's turn held: the function first tries it without waiting and
-- answers nothing when another transaction has it (the intake transaction, which took it waiting,
-- always has it: a transaction's advisory locks are re-entrant). Trying the lock here, not in the
-- calling statement, keeps the lock before the read whatever plan the statement gets.
--
-- VOLATILE and PL/pgSQL on purpose, as `devpilot_issue_turn_free` (0012): its query runs with a
-- snapshot taken when it runs, after the turn was granted, so a message committed by the turn's
-- previous holder (a start, a stop's cancels) is seen even by a statement whose own snapshot is
-- older than the lock; and a PL/pgSQL function is never inlined into the calling statement. It
-- reads dispatch_sessions_agent_idx.
CREATE OR REPLACE FUNCTION devpilot_agent_session_holder(org text, agent_session text, delivered_only boolean)
RETURNS TABLE (orchestrator_id uuid, issue_id text, issue_identifier text, opened_for uuid)
LANGUAGE plpgsql VOLATILE ROWS 1  -- (at most one: the planner then reaches each holder by its key)
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(devpilot_agent_session_turn_key(org, agent_session)) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.orchestrator_id, s.issue_id, s.issue_identifier,
           (SELECT c.id FROM dispatch_sessions c
            WHERE c.org_id = s.org_id AND c.agent_session_id = s.agent_session_id AND c.agent_session_created
            LIMIT 1)
    FROM dispatch_sessions s
    JOIN orchestrators o ON o.id = s.orchestrator_id AND o.revoked_at IS NULL
    WHERE s.org_id = org AND s.agent_session_id = agent_session
      AND s.status IN ('queued', 'delivered')
      AND (NOT delivered_only OR s.status = 'delivered')
    ORDER BY s.created_at DESC
    LIMIT 1;
END
$$;
