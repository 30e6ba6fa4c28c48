-- 0017: a dead letter of an agent session that the person then stopped is never queued again.
--
-- An operator's retry of a failed message starts its conversation again. If the person pressed
-- stop in Linear after that message failed, the retry would start work they stopped. The stop
-- marks the dead letters its agent session has at that moment (in its intake transaction, with
-- the agent session's turn held; `record_stop`), and a retry, which takes the same turn, refuses a
-- marked one (`retry_overtaken`). A mark, not a time compared with another: the turn orders the
-- stop and the retry, whatever the clocks of the transactions say, and the mark lives as long as
-- the dead letter (a stop's own record is forgotten with the delivery records).

-- When a stop of its agent session was handled while this message was failed; NULL: none was.
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS stopped_at timestamptz;

-- Dead letters written before this migration: marked when their agent session's latest stop was
-- handled after they were (`agent_session_stops`, while its record is kept).
UPDATE dead_letters d SET stopped_at = st.stopped_at
FROM dispatch_sessions s
JOIN agent_session_stops st ON st.org_id = s.org_id AND st.agent_session_id = s.agent_session_id
WHERE d.session_id = s.id AND s.status = 'failed' AND d.stopped_at IS NULL
  AND st.stopped_at >= d.failed_at;
