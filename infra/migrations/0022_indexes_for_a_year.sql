-- devpilot: no-transaction
-- 0022: indexes for what a year of sessions must not read whole: the retention sweep's walks and
-- a conversation's parts, and the search by machine.
--
-- Built CONCURRENTLY (so outside a transaction: the first line above): the tables keep taking
-- writes while each builds (Postgres holds only a SHARE UPDATE EXCLUSIVE lock, which no insert,
-- update or delete waits for); a build waits for the transactions already running to end. A run
-- interrupted half way is run again whole: each statement is idempotent, and an index an
-- interrupted build left INVALID is dropped first (shared/migrate.py). Measured build times are
-- in bench/README.md ("Upgrades on a live database").

-- The search by machine name (`/sessions?q=`): a machine's sessions, newest first.
CREATE INDEX CONCURRENTLY IF NOT EXISTS dispatch_sessions_machine_idx
    ON dispatch_sessions (orchestrator_id, created_at DESC);

-- The retention sweep's walk over the posts by age (posts of conversations that have no session:
-- an agent session no machine could take, Linear told so).
CREATE INDEX CONCURRENTLY IF NOT EXISTS linear_notices_created_idx
    ON linear_notices (created_at);

-- The retention sweep's walk over the routing requests done (those that queued nothing), and a
-- conversation's requests, open or done, by agent session and by the session they became.
CREATE INDEX CONCURRENTLY IF NOT EXISTS routing_requests_done_idx
    ON routing_requests (done_at) WHERE done_at IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS routing_requests_conversation_idx
    ON routing_requests (org_id, agent_session_id) WHERE agent_session_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS routing_requests_session_idx
    ON routing_requests (session_id) WHERE session_id IS NOT NULL;
