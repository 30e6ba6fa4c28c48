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

-- Dead letters written before this migration: marked when their agent session's latest stop
-- (`agent_session_stops`, while its record is kept) may have been handled after they were written.
-- Only times are left to tell, and the stop's is when its transaction began, which can be before a
-- dead letter it then waited for (a follow-up's last release commits while the stop waits for the
-- turn). A stop's transaction ends within its request's deadline (at most 60 s), so a dead letter
-- written before that had failed before the stop was done. (One written in those 60 s for a
-- message queued after the stop is marked too: it needs every attempt to fail within a minute,
-- which the default backoff of 60 s rules out.)
UPDATE dead_letters d SET stopped_at = st.stopped_at
FROM dispatch_sessions s
JOIN agent_session_stops st ON st.org_id = s.org_id AND st.agent_session_id = s.agent_session_id
WHERE d.session_id = s.id AND s.status = 'failed' AND d.stopped_at IS NULL
  AND d.failed_at < st.stopped_at + interval '60 seconds';
