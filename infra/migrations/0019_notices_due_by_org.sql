-- 0019: the outbox's take reads the due posts of connected orgs only.
--
-- A post of an org whose Linear connection is gone (a refused token, the app removed) waits,
-- unsent and due, for a new install; a fleet that keeps working for that org keeps adding to them.
-- The take read every due, unsent post and then dropped that org's: 50,000 waiting posts made the
-- sweep's round read about 150,000 pages (about a second on a slow host), and past the statement's
-- deadline the sweep's sending failed for every org. Indexed by org first, the sweep's take
-- (`notice_take_due`) reads the due posts of each connected org and never the waiting ones. This
-- index serves everything the one it replaces did (that one had no other reader); a release still
-- taking with the old statement during the rollout reads unsent posts from this one instead.
-- Building it holds writes to linear_notices (new posts) for its duration: about half a second per
-- million rows of the table on a 2-core machine.
CREATE INDEX IF NOT EXISTS linear_notices_due_idx
    ON linear_notices (org_id, available_at) WHERE sent_at IS NULL;
DROP INDEX IF EXISTS linear_notices_pending_idx;
