-- What is kept, and for how long (shared/operators/retention.py): a finished conversation is forgotten
-- DEVPILOT_RETENTION_DAYS after its last change, with everything that belongs to it; a live one
-- never, whatever its age. Each batch is one transaction of three statements, `retention_pick`,
-- `retention_forget` and `retention_walked`; a batch holds the locks of the conversations it looks
-- at for those statements only (milliseconds: a webhook of one of them waits that long at most).
--
-- A conversation is an agent session's messages (start, follow-ups, stop: one `dispatch_sessions`
-- row each) with its posts to Linear and its routing requests; or a plain assignment's one session
-- (`devpilot:<sessionId>`, the alias its posts carry until Linear opens an agent session for it)
-- with its posts; or a post, or a routing request, that belongs to no session. Its parts: the
-- sessions, their claims that ended unacked (`dispatch_attempts`), their dead letters, operators'
-- actions on them (`session_actions`), the posts (`linear_notices`) and routing requests of the
-- conversation. (Webhook delivery records and stops are forgotten on their own clock:
-- `prune_deliveries`.)
--
-- Finished: no session queued, no post unsent (given up or replaced: not waiting), no routing
-- request open. Its last change: the latest of its sessions' `updated_at`, its posts' creation and
-- sending, its routing requests' creation and completion.

-- name: retention_pick
-- The next conversations to look at, from where the walks stopped (`retention_cursors`, locked:
-- a second sweep running at once finds them taken and forgets nothing this time): up to `batch`
-- each of the finished sessions of each status changed before the cutoff (oldest first, by
-- dispatch_sessions_status_idx), of the posts created before it (linear_notices_created_idx), and
-- of the routing requests done before it (routing_requests_done_idx). Each row names its
-- conversation (org, key, agent: whether the key is an agent session). Only conversations whose
-- locks this transaction got without waiting come back: an agent session's turn (the intake takes
-- it for a follow-up or a stop, an operator for an action) and its keep lock (a machine's post
-- takes it, shared), or a plain assignment's session row (an operator's action locks it); one
-- whose lock is taken is looked at on the walk's next pass. With them, where each walk goes on
-- from (`cursor` rows): its last row, or its start again when it reached the cutoff.
WITH walks AS (
    SELECT walk, at, id FROM retention_cursors ORDER BY walk FOR UPDATE SKIP LOCKED
), cutoff AS (
    SELECT now() - make_interval(days => %(days)s) AS at
), seen AS (
    SELECT w.walk, s.at, s.id, s.org_id,
           coalesce(s.agent_session_id, 'devpilot:' || s.id::text) AS key, s.agent_session_id IS NOT NULL AS agent
    FROM (SELECT * FROM walks WHERE walk IN ('delivered', 'failed', 'cancelled')) w
    CROSS JOIN cutoff c
    CROSS JOIN LATERAL (
        SELECT s.id, s.org_id, s.agent_session_id, s.updated_at AS at FROM dispatch_sessions s
        WHERE s.status = w.walk AND s.updated_at < c.at AND s.updated_at >= w.at
          AND (s.updated_at > w.at OR s.id > w.id)
        ORDER BY s.updated_at, s.id
        LIMIT %(batch)s
    ) s
    UNION ALL
    SELECT w.walk, n.at, n.id, n.org_id,
           CASE WHEN o.id IS NOT NULL THEN coalesce(o.agent_session_id, 'devpilot:' || o.id::text)
                WHEN n.agent_session_id IS NOT NULL THEN n.agent_session_id
                ELSE 'post:' || n.id::text END,
           CASE WHEN o.id IS NOT NULL THEN o.agent_session_id IS NOT NULL
                ELSE n.agent_session_id IS NOT NULL AND n.agent_session_id NOT LIKE 'devpilot:%%' END
    FROM (SELECT * FROM walks WHERE walk = 'posts') w
    CROSS JOIN cutoff c
    CROSS JOIN LATERAL (
        SELECT n.id, n.org_id, n.agent_session_id, n.session_id, n.created_at AS at FROM linear_notices n
        WHERE n.created_at < c.at AND n.created_at >= w.at AND (n.created_at > w.at OR n.id > w.id)
        ORDER BY n.created_at, n.id
        LIMIT %(batch)s
    ) n
    -- (its session: the one it names, or the one a plain assignment's alias names)
    LEFT JOIN dispatch_sessions o ON o.id = coalesce(
        n.session_id,
        CASE WHEN n.agent_session_id LIKE 'devpilot:%%' THEN substr(n.agent_session_id, 10)::uuid END)
    UNION ALL
    SELECT w.walk, r.at, r.id, r.org_id,
           CASE WHEN r.agent_session_id IS NOT NULL THEN r.agent_session_id
                WHEN o.id IS NOT NULL THEN coalesce(o.agent_session_id, 'devpilot:' || o.id::text)
                ELSE 'routing:' || r.id::text END,
           r.agent_session_id IS NOT NULL OR o.agent_session_id IS NOT NULL
    FROM (SELECT * FROM walks WHERE walk = 'routing') w
    CROSS JOIN cutoff c
    CROSS JOIN LATERAL (
        SELECT r.id, r.org_id, r.agent_session_id, r.session_id, r.done_at AS at FROM routing_requests r
        WHERE r.done_at < c.at AND r.done_at >= w.at AND (r.done_at > w.at OR r.id > w.id)
        ORDER BY r.done_at, r.id
        LIMIT %(batch)s
    ) r
    LEFT JOIN dispatch_sessions o ON o.id = r.session_id
), conversations AS (
    SELECT DISTINCT org_id, key, agent FROM seen
), plain_locked AS (
    SELECT s.id FROM dispatch_sessions s
    WHERE s.id = ANY (ARRAY(SELECT substr(key, 10)::uuid FROM conversations WHERE NOT agent AND key LIKE 'devpilot:%%'))
    FOR UPDATE SKIP LOCKED
), locked AS (
    SELECT c.org_id, c.key, c.agent FROM conversations c
    -- (a plain assignment's session, by its key)
    LEFT JOIN LATERAL (
        SELECT true AS here FROM dispatch_sessions s
        WHERE NOT c.agent AND c.key LIKE 'devpilot:%%' AND s.id = substr(c.key, 10)::uuid
        LIMIT 1
    ) plain ON true
    WHERE CASE WHEN c.agent THEN pg_try_advisory_xact_lock(devpilot_agent_session_turn_key(c.org_id, c.key))
                                 AND pg_try_advisory_xact_lock(devpilot_conversation_key(c.org_id, c.key))
               WHEN c.key LIKE 'devpilot:%%'
                   -- (its session locked; or gone: posts left under the alias of a session forgotten)
                   THEN (plain.here IS NULL OR substr(c.key, 10)::uuid IN (SELECT id FROM plain_locked))
                        AND pg_try_advisory_xact_lock(devpilot_conversation_key(c.org_id, c.key))
               ELSE true END
)
SELECT 'conversation' AS kind, org_id, key, agent, NULL AS walk, NULL::timestamptz AS at, NULL::uuid AS id
FROM locked
UNION ALL
-- (a NULL `at`: the walk starts again)
SELECT 'cursor', NULL, NULL, NULL, w.walk, last.at, last.id
FROM walks w
LEFT JOIN LATERAL (
    SELECT s.at, s.id FROM seen s WHERE s.walk = w.walk
    ORDER BY s.at DESC, s.id DESC
    LIMIT 1
) last ON (SELECT count(*) FROM seen s WHERE s.walk = w.walk) >= %(batch)s;

-- name: retention_forget
-- Owner: retention (it forgets the rows of the other tables past their retention).
-- After `retention_pick`, in its transaction (this statement's snapshot is taken after the locks
-- were granted): of the conversations picked, those still finished and last changed before the
-- cutoff are forgotten whole, every part of each in this one statement; the others are left as
-- they are. What was forgotten, counted.
WITH conv AS (
    SELECT DISTINCT c.org_id, c.key, c.agent
    FROM unnest(%(orgs)s::text[], %(keys)s::text[], %(agents)s::boolean[]) AS c(org_id, key, agent)
), cutoff AS (
    SELECT now() - make_interval(days => %(days)s) AS at
), members AS (
    SELECT c.org_id, c.key, s.id, s.status, s.updated_at
    FROM conv c
    CROSS JOIN LATERAL (
        SELECT s.id, s.status, s.updated_at FROM dispatch_sessions s
        WHERE c.agent AND s.org_id = c.org_id AND s.agent_session_id = c.key
        UNION ALL
        SELECT s.id, s.status, s.updated_at FROM dispatch_sessions s
        WHERE NOT c.agent AND c.key LIKE 'devpilot:%%' AND s.id = substr(c.key, 10)::uuid
    ) s
), posts AS (
    SELECT c.org_id, c.key, n.id, n.sent_at, n.available_at, n.created_at
    FROM conv c
    CROSS JOIN LATERAL (
        SELECT n.id, n.sent_at, n.available_at, n.created_at FROM linear_notices n
        WHERE (c.agent OR c.key LIKE 'devpilot:%%') AND n.org_id = c.org_id AND n.agent_session_id = c.key
        UNION
        SELECT n.id, n.sent_at, n.available_at, n.created_at FROM linear_notices n
        WHERE n.session_id = ANY (ARRAY(SELECT m.id FROM members m WHERE m.org_id = c.org_id AND m.key = c.key))
        UNION
        SELECT n.id, n.sent_at, n.available_at, n.created_at FROM linear_notices n
        WHERE c.key LIKE 'post:%%' AND n.id = substr(c.key, 6)::uuid
    ) n
), routes AS (
    SELECT c.org_id, c.key, r.id, r.done_at, r.created_at
    FROM conv c
    CROSS JOIN LATERAL (
        SELECT r.id, r.done_at, r.created_at FROM routing_requests r
        WHERE c.agent AND r.org_id = c.org_id AND r.agent_session_id = c.key
        UNION
        SELECT r.id, r.done_at, r.created_at FROM routing_requests r
        WHERE r.session_id = ANY (ARRAY(SELECT m.id FROM members m WHERE m.org_id = c.org_id AND m.key = c.key))
        UNION
        SELECT r.id, r.done_at, r.created_at FROM routing_requests r
        WHERE c.key LIKE 'routing:%%' AND r.id = substr(c.key, 9)::uuid
    ) r
), kept AS (
    SELECT m.org_id, m.key FROM members m, cutoff WHERE m.status = 'queued' OR m.updated_at >= cutoff.at
    UNION
    SELECT p.org_id, p.key FROM posts p, cutoff
    WHERE (p.sent_at IS NULL AND p.available_at < 'infinity') OR p.created_at >= cutoff.at
       OR p.sent_at >= cutoff.at
    UNION
    SELECT r.org_id, r.key FROM routes r, cutoff
    WHERE r.done_at IS NULL OR r.done_at >= cutoff.at OR r.created_at >= cutoff.at
), gone AS (
    SELECT org_id, key FROM conv
    EXCEPT
    SELECT org_id, key FROM kept
-- (Each part deleted by its key, `= ANY (ARRAY(...))`: as a join, the planner may read a whole table.)
), gone_sessions AS (
    SELECT ARRAY(SELECT m.id FROM members m JOIN gone USING (org_id, key)) AS ids
), forgot_posts AS (
    DELETE FROM linear_notices
    WHERE id = ANY (ARRAY(SELECT p.id FROM posts p JOIN gone USING (org_id, key)))
    RETURNING 1
), forgot_routes AS (
    DELETE FROM routing_requests
    WHERE id = ANY (ARRAY(SELECT r.id FROM routes r JOIN gone USING (org_id, key)))
    RETURNING 1
), forgot_attempts AS (
    DELETE FROM dispatch_attempts WHERE session_id = ANY ((SELECT ids FROM gone_sessions)::uuid[]) RETURNING 1
), forgot_letters AS (
    DELETE FROM dead_letters WHERE session_id = ANY ((SELECT ids FROM gone_sessions)::uuid[]) RETURNING 1
), forgot_actions AS (
    DELETE FROM session_actions WHERE session_id = ANY ((SELECT ids FROM gone_sessions)::uuid[]) RETURNING 1
), forgot_sessions AS (
    DELETE FROM dispatch_sessions WHERE id = ANY ((SELECT ids FROM gone_sessions)::uuid[]) AND status <> 'queued'
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS conversations,
       (SELECT count(*) FROM forgot_sessions) AS sessions,
       (SELECT count(*) FROM forgot_posts) AS posts,
       (SELECT count(*) FROM forgot_routes) AS routes,
       (SELECT count(*) FROM forgot_attempts) + (SELECT count(*) FROM forgot_letters)
           + (SELECT count(*) FROM forgot_actions) AS records;

-- name: retention_walked
-- In the batch's transaction, after `retention_forget`: where each walk goes on from next (a NULL
-- `at`: back to its start).
UPDATE retention_cursors c
SET at = coalesce(x.at, '-infinity'), id = coalesce(x.id, '00000000-0000-0000-0000-000000000000')
FROM unnest(%(walks)s::text[], %(ats)s::timestamptz[], %(ids)s::uuid[]) AS x(walk, at, id)
WHERE c.walk = x.walk;
