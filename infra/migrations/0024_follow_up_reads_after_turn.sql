-- 0024: a follow-up decided whole in its one statement: the agent session's open routing request,
-- read after the turn.
--
-- A follow-up (`prompted`) in an agent session nobody holds yet waits behind a start of it still
-- waiting for Linear to name its machine (a routing request of its own, routed after it), and one
-- with the `select` signal may be the person's answer to the question that request asked. The
-- follow-ups' statement (`follow_ups_for_delivery`) waits for the agent session's turn and reads
-- this after it. VOLATILE and PL/pgSQL, as `devpilot_agent_session_holder` (0013): its query runs
-- with a snapshot taken when it runs, after the turn was granted, so a request written or
-- completed by the turn's previous holder (a start, the routing) is seen even by a statement whose
-- own snapshot is older than the turn. It reads an index of the agent session's requests.
--
-- The agent session's open request that asked the person which repository, else its earliest open
-- one (a later message waits behind it in a request of its own, routed after it); `asked`: whether
-- it asked. No row: nothing of the agent session waits to be routed.
CREATE OR REPLACE FUNCTION devpilot_agent_session_request(org text, agent_session text)
RETURNS TABLE (id uuid, asked boolean)
LANGUAGE plpgsql VOLATILE ROWS 1
AS $$
BEGIN
    RETURN QUERY
    SELECT r.id, r.asked_at IS NOT NULL
    FROM routing_requests r
    WHERE r.org_id = org AND r.agent_session_id = agent_session AND r.done_at IS NULL
    ORDER BY r.asked_at IS NULL, r.seq
    LIMIT 1;
END
$$;
