-- 0006: the operators' dashboard signs in with server-side sessions: a random token per login
-- (the cookie holds it; the table holds only its hash), ended on the server by logout, at most
-- 12 hours; and repeated wrong admin tokens from one client are refused for a while.

CREATE TABLE IF NOT EXISTS dashboard_sessions (
    token_hash  bytea PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS dashboard_login_failures (
    client      text PRIMARY KEY,        -- the client's address as the server sees it
    failures    integer NOT NULL,
    first_at    timestamptz NOT NULL     -- the start of the current window
);
