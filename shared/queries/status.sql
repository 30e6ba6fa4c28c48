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
-- One pass over the sessions: a session is undelivered at the end of each minute from the one it
-- was created in up to the one before it ended (queued: up to now), so the depth is the running
-- sum of +1 at its first minute and -1 at its end's. It ended when it was delivered
-- (`delivered_at`; a delivered session is changed once more when Linear opens the agent session
-- of a plain assignment, which may be minutes later), or failed or was cancelled (its last
-- change): one pass, not a count per minute (each of which read the table again).
-- Sessions are kept, so it reads only those that can count: the queued ones and those changed in
-- the window, through dispatch_sessions_status_idx (status, updated_at), never every session (a
-- read that grows with what is kept). Its conditions are written for that index: every
-- status but `queued` is named (the table's CHECK lists four), and an ack sets `delivered_at` and
-- `updated_at` together, and only a delivered session has `delivered_at` (a retry clears it), so
-- one that ended or was acked in the window was changed in it. The window's bounds are written as
-- expressions of now(), not read from a CTE: the planner estimates a condition on now() with its
-- value, and one on a CTE's column blind (a third of the rows): at a year's sessions that plan
-- read every session (bench/README.md, "A year of sessions"); this one reads the window.
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes', date_trunc('minute', now()),
                           interval '1 minute') AS m
),
open_in_window AS (
    SELECT greatest(date_trunc('minute', s.created_at), date_trunc('minute', now()) - interval '59 minutes')
               AS opened,
           CASE WHEN s.status <> 'queued' THEN date_trunc('minute', coalesce(s.delivered_at, s.updated_at)) END
               AS closed
    FROM dispatch_sessions s
    WHERE s.created_at < date_trunc('minute', now()) + interval '1 minute'
      AND (s.status = 'queued'
           OR (s.status IN ('delivered', 'failed', 'cancelled')
               AND s.updated_at >= date_trunc('minute', now()) - interval '58 minutes'
               AND coalesce(s.delivered_at, s.updated_at) >= date_trunc('minute', now()) - interval '58 minutes'))
),
per_minute AS (
    SELECT m, sum(d) AS d
    FROM (SELECT opened AS m, 1 AS d FROM open_in_window
          UNION ALL
          SELECT closed, -1 FROM open_in_window WHERE closed IS NOT NULL) steps
    GROUP BY m
),
acked AS (
    SELECT date_trunc('minute', s.delivered_at) AS m,
           avg(extract(epoch FROM s.delivered_at - s.created_at))::float AS latency_s
    FROM dispatch_sessions s
    WHERE s.delivered_at >= date_trunc('minute', now()) - interval '59 minutes'
      AND s.delivered_at < date_trunc('minute', now()) + interval '1 minute'
      AND s.status = 'delivered' AND s.updated_at >= date_trunc('minute', now()) - interval '59 minutes'
    GROUP BY 1
)
SELECT mm.m AS minute,
       (sum(coalesce(p.d, 0)) OVER (ORDER BY mm.m))::bigint AS depth,
       a.latency_s
FROM minutes mm
LEFT JOIN per_minute p ON p.m = mm.m
LEFT JOIN acked a ON a.m = mm.m
ORDER BY mm.m;

-- name: status_totals
-- The cards: the sessions queued now (one queue row each: the live queue, never the sessions
-- kept), and those that became delivered, failed or cancelled in the last 24 hours (their last
-- change), by dispatch_sessions_status_idx. Sessions are kept for DEVPILOT_RETENTION_DAYS: a
-- count of them all grew with what is kept; this one reads a day's
-- sessions, whatever is kept, and a card says what happened today rather than since a date the
-- retention moves.
SELECT 'queued' AS status, count(*) AS n FROM dispatch_queue
UNION ALL
SELECT s.status, count(*) AS n
FROM dispatch_sessions s
WHERE s.status IN ('delivered', 'failed', 'cancelled') AND s.updated_at >= now() - interval '24 hours'
GROUP BY s.status;

-- name: status_now
SELECT now() AS t;
