-- Each workspace's pace with Linear (`linear_paces`, shared/linear/pace.py): when Linear refuses a call
-- for its rate limit, nothing of the org is sent before the time Linear gave. The pace is a row,
-- not a process's memory, so every instance of the service keeps it.

-- name: pace_refused
-- A fragment, a CTE's body: Linear refused a call of the org for its rate limit. The org waits
-- until `seconds` from now (the later of that and a wait already recorded: two instances refused
-- at once keep the longer), and the refusal is counted.
INSERT INTO linear_paces (org_id, blocked_until, refusals, last_refused_at, budget)
VALUES (%(org_id)s, now() + make_interval(secs => %(seconds)s), 1, now(), %(budget)s)
ON CONFLICT (org_id) DO UPDATE
SET blocked_until = greatest(linear_paces.blocked_until, excluded.blocked_until),
    refusals = linear_paces.refusals + 1, last_refused_at = now(), budget = excluded.budget
RETURNING blocked_until

-- name: pace_record
-- A refusal that nothing else records (a read that routing goes on without: Linear's repository
-- suggestion), in its own statement.
WITH paced AS (
-- include: pace_refused
)
SELECT blocked_until FROM paced;
