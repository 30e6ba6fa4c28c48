-- Telling Linear what happened: the `linear_notices` outbox and the org credentials it posts with.

-- name: notice_insert
-- In the caller's transaction: the notice commits with the state change that causes it, or not at
-- all; nothing is written for an org Linear is not told about.
INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
SELECT %(org_id)s, %(session_id)s, %(kind)s, %(agent_session_id)s, %(issue_id)s, %(body)s
WHERE devpilot_notifies(%(org_id)s)
RETURNING id;

-- name: notice_take
-- Takes due, unsent notices (those named, or any when none are named) for sending: SKIP LOCKED and
-- a short lease, so two senders never post the same notice at once.
WITH due AS (
    SELECT id FROM linear_notices
    WHERE sent_at IS NULL AND available_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
    ORDER BY available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE linear_notices n SET lease_expires_at = now() + interval '30 seconds', attempts = n.attempts + 1
FROM due WHERE n.id = due.id
RETURNING n.id, n.org_id, n.kind, n.agent_session_id, n.issue_id, n.body, n.attempts,
          (SELECT token_encrypted FROM linear_credentials c WHERE c.org_id = n.org_id) AS token_encrypted;

-- name: notice_sent
-- Compare-and-set: marks it sent once, with Linear's id; a second success changes nothing.
UPDATE linear_notices SET sent_at = now(), linear_id = %(linear_id)s, lease_expires_at = NULL, last_error = NULL
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_failed
-- A failed send: due again after devpilot_backoff(attempts); past the attempt limit it is given up
-- (sent_at stays NULL, available_at far away) with the error kept for operators.
UPDATE linear_notices
SET lease_expires_at = NULL, last_error = %(error)s,
    available_at = CASE WHEN attempts >= %(max_attempts)s THEN 'infinity'::timestamptz
                        ELSE now() + make_interval(secs => devpilot_backoff(attempts, %(base)s, %(cap)s)) END
WHERE id = %(id)s AND sent_at IS NULL;

-- name: credentials_upsert
-- One org's Linear token, already encrypted by the service; a second store replaces the first.
INSERT INTO linear_credentials (org_id, token_encrypted) VALUES (%(org_id)s, %(token)s)
ON CONFLICT (org_id) DO UPDATE SET token_encrypted = excluded.token_encrypted, updated_at = now();

-- name: credentials_list
-- The orgs that have a token, never the token.
SELECT org_id, created_at, updated_at FROM linear_credentials ORDER BY org_id;

-- name: credentials_delete
DELETE FROM linear_credentials WHERE org_id = %(org_id)s RETURNING org_id;
