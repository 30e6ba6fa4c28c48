-- Telling Linear what happened: the `linear_notices` outbox and the org credentials it posts with.

-- name: notice_insert
-- In the caller's transaction: the notice commits with the state change that causes it, or not at
-- all; nothing is written for an org Linear is not told about.
INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
SELECT %(org_id)s, %(session_id)s, %(kind)s, %(agent_session_id)s, %(issue_id)s, %(body)s
WHERE devpilot_notifies(%(org_id)s)
RETURNING id;

-- name: notice_take
-- Takes due, unsent notices for sending (those named by id or by agent session, or any when none
-- are named): SKIP LOCKED and a short lease, so two senders never post the same notice at once.
-- In order per agent session: not while an earlier post of its agent session is unsent (in flight,
-- or waiting out its backoff); one given up (available_at = infinity) no longer holds the rest back.
-- Posts of an org without a working connection (disconnected, or none) are not taken: they wait,
-- attempts untouched, for a new install.
WITH due AS (
    SELECT id FROM linear_notices n0
    WHERE sent_at IS NULL AND available_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND ((%(ids)s::uuid[] IS NULL AND %(agent_sessions)s::text[] IS NULL)
           OR id = ANY(%(ids)s::uuid[]) OR agent_session_id = ANY(%(agent_sessions)s::text[]))
      AND EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = n0.org_id AND c.disconnected_at IS NULL)
      AND (n0.agent_session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM linear_notices earlier
            WHERE earlier.agent_session_id = n0.agent_session_id AND earlier.sent_at IS NULL
              AND earlier.available_at < 'infinity' AND earlier.seq < n0.seq))
    ORDER BY seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE linear_notices n SET lease_expires_at = now() + interval '30 seconds', attempts = n.attempts + 1
FROM due WHERE n.id = due.id
RETURNING n.id, n.org_id, n.kind, n.agent_session_id, n.issue_id, n.body, n.content, n.ephemeral,
          n.signal, n.signal_metadata, n.attempts;

-- name: notice_sent
-- Compare-and-set: marks it sent once, with Linear's id; a second success changes nothing.
UPDATE linear_notices SET sent_at = now(), linear_id = %(linear_id)s, lease_expires_at = NULL, last_error = NULL
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_wait
-- Taken, but the org's connection went away meanwhile (a refresh Linear refused): back to waiting,
-- the attempt not counted, due again as soon as the org is connected again.
UPDATE linear_notices SET lease_expires_at = NULL, attempts = greatest(attempts - 1, 0), last_error = %(error)s
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_failed
-- A failed send: due again after devpilot_backoff(attempts); past the attempt limit it is given up
-- (sent_at stays NULL, available_at far away) with the error kept for operators.
UPDATE linear_notices
SET lease_expires_at = NULL, last_error = %(error)s,
    available_at = CASE WHEN attempts >= %(max_attempts)s THEN 'infinity'::timestamptz
                        ELSE now() + make_interval(secs => devpilot_backoff(attempts, %(base)s, %(cap)s)) END
WHERE id = %(id)s AND sent_at IS NULL;

-- name: activity_rights
-- May this machine speak in this agent session (a message of it was delivered to it), and is the
-- org connected to Linear? Read in the transaction that then accepts the activity.
SELECT EXISTS (
           SELECT 1 FROM dispatch_sessions s
           WHERE s.org_id = %(org_id)s AND s.agent_session_id = %(agent_session_id)s
             AND s.orchestrator_id = %(orchestrator_id)s AND s.status = 'delivered'
       ) AS holds,
       devpilot_notifies(%(org_id)s) AS connected;

-- name: activity_insert
-- The agent's activity into the outbox, idempotent by the caller's id (also Linear's input.id):
-- the same id again inserts nothing. Posted after commit, in acceptance order (seq).
INSERT INTO linear_notices (id, org_id, kind, agent_session_id, body, content, ephemeral, orchestrator_id,
                            signal, signal_metadata)
VALUES (%(id)s, %(org_id)s, 'activity', %(agent_session_id)s, %(body)s, %(content)s, %(ephemeral)s,
        %(orchestrator_id)s, %(signal)s, %(signal_metadata)s)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: activity_same
-- For a repeated id: is it this machine's activity in this agent session (same answer again), or
-- someone else's (not found)?
SELECT EXISTS (
    SELECT 1 FROM linear_notices
    WHERE id = %(id)s AND org_id = %(org_id)s AND agent_session_id = %(agent_session_id)s
      AND orchestrator_id = %(orchestrator_id)s
) AS same;

-- name: activity_list
-- An agent session's activities in the order they were accepted (seq): the service's own notices
-- and the agent's, sent or waiting, for the machine that holds the agent session (checked by the
-- caller with `activity_rights`, in the same transaction). At most 1,000, the newest.
SELECT * FROM (
    SELECT n.id, n.kind, n.body, n.content, n.signal, n.signal_metadata, n.created_at, n.sent_at,
           n.orchestrator_id IS NOT NULL AS by_agent, n.seq
    FROM linear_notices n
    WHERE n.org_id = %(org_id)s AND n.agent_session_id = %(agent_session_id)s
    ORDER BY n.seq DESC
    LIMIT 1000
) newest ORDER BY seq;
