-- 0013: an agent session's turn key as a function, for the statements that take the turn.
--
-- The intake transaction takes an agent session's turn waiting (`agent_session_turn`); the group
-- commit of agent sessions `created` together (`route_and_start_agent_sessions_many_for_delivery`)
-- tries it without waiting. Both must lock the same key: it is written here once. (The value is the
-- one the earlier inline expression computed, so a service still running the code before this
-- migration takes the same turns.)
CREATE OR REPLACE FUNCTION devpilot_agent_session_turn_key(org text, agent_session text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(org || '/' || agent_session, 0);
