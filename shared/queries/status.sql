-- The operators' figures (devpilot status, the dashboard, /metrics), read-only, in one READ ONLY
-- transaction so they agree with each other.

-- name: status_per_orchestrator
-- Per orchestrator: live rows by state, how long the oldest due row has waited, attempts so far.
-- Reads the queue through its orchestrator index; the hot table holds only live work.
SELECT o.id, o.org_id, o.linear_user_id, o.name, o.last_seen_at, o.revoked_at,
       coalesce((SELECT i.repositories FROM machine_inventories i WHERE i.orchestrator_id = o.id), '[]')
           AS repositories,
       coalesce((SELECT i.labels FROM machine_inventories i WHERE i.orchestrator_id = o.id), '{}') AS labels,
       count(q.id) FILTER (WHERE q.lease_expires_at IS NULL) AS queued,
       count(q.id) FILTER (WHERE q.lease_expires_at IS NOT NULL) AS claimed,
       extract(epoch FROM now() - min(q.available_at)
               FILTER (WHERE q.lease_expires_at IS NULL AND q.available_at <= now()))::float AS oldest_due_s,
       coalesce(sum(q.attempts), 0) AS attempts
FROM orchestrators o
LEFT JOIN dispatch_queue q ON q.orchestrator_id = o.id
GROUP BY o.id
ORDER BY count(q.id) DESC, o.last_seen_at DESC NULLS LAST, o.created_at;

-- name: status_recent_failed
-- The most recent failures (dead letters, releases at the limit), newest first.
SELECT s.id, s.org_id, s.orchestrator_id, s.issue_identifier, s.failure_reason, s.updated_at
FROM dispatch_sessions s
WHERE s.status = 'failed'
ORDER BY s.updated_at DESC
LIMIT %(limit)s;

-- name: status_last_sweep
SELECT ran_at, requeued, dead_lettered FROM sweep_runs ORDER BY id DESC LIMIT 1;

-- name: status_history
-- Minute by minute over the last hour, derived from the sessions themselves: how many were
-- undelivered at the end of each minute, and the mean webhook-to-ack time of those acked in it.
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS m
)
SELECT m.m AS minute,
       (SELECT count(*) FROM dispatch_sessions s
         WHERE s.created_at < m.m + interval '1 minute'
           AND (s.status = 'queued' OR s.updated_at >= m.m + interval '1 minute')) AS depth,
       (SELECT avg(extract(epoch FROM s.delivered_at - s.created_at))::float FROM dispatch_sessions s
         WHERE s.delivered_at >= m.m AND s.delivered_at < m.m + interval '1 minute') AS latency_s
FROM minutes m
ORDER BY m.m;

-- name: status_totals
SELECT status, count(*) AS n FROM dispatch_sessions GROUP BY status;

-- name: status_now
SELECT now() AS t;
