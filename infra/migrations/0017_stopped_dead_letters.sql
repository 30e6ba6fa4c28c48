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
