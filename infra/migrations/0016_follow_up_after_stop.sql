-- 0016: a follow-up written before its agent session was stopped, handled after the stop, does
-- nothing.
--
-- Linear retries a delivery that failed (about 1 min, 1 h and 6 h later), and two instances each
-- keep only their own webhooks in order. So a follow-up the person wrote before pressing stop can
-- be handled after the stop: it then started the conversation again (no machine holds it once its
-- start is cancelled), or reached the machine as a prompt after its `stop` message, and the agent
-- went back to work that the person had stopped. Every stop now records when the person pressed
-- it (`agentActivity.createdAt`, the latest of the agent session's stops), and a follow-up written
-- at or before that time does nothing. A follow-up written after the stop goes on as before.

-- When the person last stopped the agent session (Linear's time of the stop's activity; NULL when
-- no stop gave a time that could be read).
ALTER TABLE agent_session_stops ADD COLUMN IF NOT EXISTS last_stop_at timestamptz;

-- Whether the agent session was stopped at or after `written` (a follow-up's time): read with its
-- turn held by the caller (`record_delivery`, `prompt_holders_for_delivery`). VOLATILE and
-- PL/pgSQL, as `devpilot_agent_session_seen` (0014): its query runs with a snapshot taken when it is
-- called, after the turn was granted, so a stop committed by the turn's previous holder is seen
-- even by a statement that had to wait for the turn.
CREATE OR REPLACE FUNCTION devpilot_agent_session_stopped_since(org text, agent_session text, written timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN EXISTS (
        SELECT FROM agent_session_stops st
        WHERE st.org_id = org AND st.agent_session_id = agent_session AND st.last_stop_at >= written
    );
END
$$;
