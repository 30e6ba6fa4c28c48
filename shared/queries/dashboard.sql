-- The operators' dashboard: its sessions and its sign-in attempt limit.

-- name: dashboard_session_create
-- A new random session per login; only its hash is stored. Expired ones are cleared on the way.
WITH gone AS (DELETE FROM dashboard_sessions WHERE expires_at < now())
INSERT INTO dashboard_sessions (token_hash, expires_at)
VALUES (%(token_hash)s, now() + make_interval(secs => %(seconds)s));

-- name: dashboard_session_valid
SELECT 1 AS ok FROM dashboard_sessions WHERE token_hash = %(token_hash)s AND expires_at > now();

-- name: dashboard_session_end
-- Logout ends the session on the server: the old cookie opens nothing afterwards.
DELETE FROM dashboard_sessions WHERE token_hash = %(token_hash)s;

-- name: dashboard_login_blocked
-- Too many wrong tokens from this client within the window.
SELECT 1 AS blocked FROM dashboard_login_failures
WHERE client = %(client)s AND failures >= %(limit)s AND first_at > now() - make_interval(secs => %(window)s);

-- name: dashboard_login_failed
-- One more wrong token: counted in the current window, or the first of a new one.
INSERT INTO dashboard_login_failures (client, failures, first_at) VALUES (%(client)s, 1, now())
ON CONFLICT (client) DO UPDATE SET
    failures = CASE WHEN dashboard_login_failures.first_at > now() - make_interval(secs => %(window)s)
                    THEN dashboard_login_failures.failures + 1 ELSE 1 END,
    first_at = CASE WHEN dashboard_login_failures.first_at > now() - make_interval(secs => %(window)s)
                    THEN dashboard_login_failures.first_at ELSE now() END;

-- name: dashboard_login_ok
DELETE FROM dashboard_login_failures WHERE client = %(client)s;
