-- The registry of machines that take work, and their bearer tokens (stored as SHA-256 only).

-- name: orchestrator_insert
INSERT INTO orchestrators (org_id, linear_user_id, name, token_hash)
VALUES (%(org_id)s, %(linear_user_id)s, %(name)s, %(token_hash)s)
RETURNING id;

-- name: orchestrator_by_token
-- Active orchestrators only: a revoked token authenticates nothing, from its next request on.
SELECT id, org_id, linear_user_id, name FROM orchestrators
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL;

-- name: orchestrator_list
SELECT id, org_id, linear_user_id, name, created_at, last_seen_at, revoked_at
FROM orchestrators ORDER BY created_at, id;

-- name: orchestrator_revoke
-- Idempotent: revoking twice keeps the first revocation time. The NOTIFY (sent on commit) wakes a
-- long-poll of this machine that is already waiting, so it ends instead of returning work.
UPDATE orchestrators SET revoked_at = coalesce(revoked_at, now())
WHERE id = %(id)s RETURNING id, revoked_at, pg_notify('devpilot_dispatch', id::text) AS woken;

-- name: orchestrator_active
SELECT id FROM orchestrators WHERE id = %(id)s AND revoked_at IS NULL;

-- name: touch_orchestrator
-- Records that the orchestrator was seen; routing prefers the most recently seen. At most one
-- write a second per machine, so idle polls and concurrent claimers cost a read, not a row update.
UPDATE orchestrators SET last_seen_at = now()
WHERE id = %(orchestrator_id)s AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second');

-- name: orchestrator_by_id
-- For an agent token: the active machine it names, with the hash its mac is keyed with.
SELECT id, org_id, linear_user_id, name, token_hash FROM orchestrators
WHERE id = %(id)s AND revoked_at IS NULL;
