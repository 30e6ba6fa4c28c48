-- An org's connection to Linear: the tokens the service posts with (encrypted by the service;
-- never returned, never logged), their expiry, and whether Linear still accepts them.

-- name: credentials_upsert
-- A static token (a personal API key, or one obtained elsewhere): never refreshed.
INSERT INTO linear_credentials (org_id, token_encrypted, kind) VALUES (%(org_id)s, %(token)s, 'static')
ON CONFLICT (org_id) DO UPDATE
SET token_encrypted = excluded.token_encrypted, kind = 'static', refresh_token_encrypted = NULL,
    expires_at = NULL, disconnected_at = NULL, disconnect_reason = NULL, app_user_id = NULL, updated_at = now();

-- name: credentials_store_oauth
-- An OAuth install: access token, refresh token and expiry in one statement (one transaction),
-- with the app user the token acts as (`viewer`); a new install of a disconnected org connects it again.
INSERT INTO linear_credentials (org_id, token_encrypted, refresh_token_encrypted, expires_at, kind, workspace_name,
                                app_user_id)
VALUES (%(org_id)s, %(token)s, %(refresh)s, now() + make_interval(secs => %(expires_in)s), 'oauth', %(name)s,
        %(app_user_id)s)
ON CONFLICT (org_id) DO UPDATE
SET token_encrypted = excluded.token_encrypted, refresh_token_encrypted = excluded.refresh_token_encrypted,
    expires_at = excluded.expires_at, kind = 'oauth', workspace_name = excluded.workspace_name,
    app_user_id = coalesce(excluded.app_user_id, linear_credentials.app_user_id),
    disconnected_at = NULL, disconnect_reason = NULL, updated_at = now();

-- name: credentials_get
SELECT org_id, kind, token_encrypted, refresh_token_encrypted, expires_at, disconnected_at
FROM linear_credentials WHERE org_id = %(org_id)s;

-- name: credentials_lock
-- The refresh lock: one instance at a time refreshes an org's token (Linear rotates the refresh
-- token on use; two instances spending the same one would lock each other out). Held while the
-- refresh request is made, until the new pair is stored in the same transaction.
SELECT org_id, kind, token_encrypted, refresh_token_encrypted, expires_at, disconnected_at
FROM linear_credentials WHERE org_id = %(org_id)s
FOR UPDATE;

-- name: credentials_rotate
-- In the lock's transaction: the new access token and the rotated refresh token together.
UPDATE linear_credentials
SET token_encrypted = %(token)s, refresh_token_encrypted = coalesce(%(refresh)s, refresh_token_encrypted),
    expires_at = now() + make_interval(secs => %(expires_in)s), updated_at = now()
WHERE org_id = %(org_id)s;

-- name: credentials_disconnect
-- Linear refused a refresh, or the app was uninstalled: the org's posts wait for a new install.
UPDATE linear_credentials SET disconnected_at = now(), disconnect_reason = %(reason)s, updated_at = now()
WHERE org_id = %(org_id)s AND disconnected_at IS NULL
RETURNING org_id;

-- name: credentials_list
-- The orgs that have a connection, never a token; and each one's pace with Linear: until when its
-- posts wait for Linear's rate limit (NULL: they do not), and how many of its calls Linear refused
-- for it so far (`linear_paces`).
SELECT c.org_id, c.kind, c.workspace_name, c.expires_at, c.disconnected_at, c.disconnect_reason,
       c.created_at, c.updated_at,
       CASE WHEN p.blocked_until > now() THEN p.blocked_until END AS paced_until,
       coalesce(p.refusals, 0) AS ratelimited, p.budget AS ratelimit_budget
FROM linear_credentials c LEFT JOIN linear_paces p ON p.org_id = c.org_id
ORDER BY c.org_id;

-- name: credentials_delete
DELETE FROM linear_credentials WHERE org_id = %(org_id)s RETURNING org_id;
