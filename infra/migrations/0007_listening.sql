-- 0007: an enqueue sends its NOTIFY only to a machine that is long-polling.
--
-- Postgres serialises the commits of every transaction that sent a NOTIFY, behind one lock held
-- through its WAL flush, so a NOTIFY on every webhook made all intake commits wait in one line. Only
-- a long-poll listens for it (Realtime reads the WAL; a plain poll reads the table), so a long-poll
-- now says so first: it sets `listening_until` to the end of its wait, and the enqueue reads it with
-- a lock that orders the two (see `enqueue` and `mark_listening` in shared/queries/).
ALTER TABLE orchestrators ADD COLUMN IF NOT EXISTS listening_until timestamptz;
