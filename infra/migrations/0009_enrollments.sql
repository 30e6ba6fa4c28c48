-- 0009: people connect their own machines by signing in with Linear (/enroll, /me).
--
-- An enrollment is one `devpilot-orchestrator login`: the machine's name and the S256 challenge of
-- a PKCE verifier only the machine holds; in loopback mode the port it listens on, in code mode the
-- hash of the short code a person types on /enroll. A browser signs in with Linear for it; the
-- service learns who signed in (and revokes Linear's token at once), and the machine redeems the
-- enrollment once for its token. Nothing here is a credential in the clear: codes, states, cookies
-- and tokens are stored as SHA-256 only. Unfinished enrollments are forgotten by the sweep.

CREATE TABLE IF NOT EXISTS enrollments (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    mode             text NOT NULL CHECK (mode IN ('loopback', 'code')),
    name             text NOT NULL,
    code_challenge   text NOT NULL,         -- BASE64URL(SHA-256(the machine's verifier))
    loopback_port    integer CHECK (loopback_port BETWEEN 1024 AND 65535),
    user_code_hash   bytea UNIQUE,          -- code mode: the typed code's hash
    requested_from   text,                  -- the address the machine asked from (shown on the confirm page)
    -- pending: nobody has signed in; signed_in: a person has (loopback: a one-time code is out;
    -- code: the confirm page is shown); approved: code mode, Register was pressed; denied: Deny was;
    -- spent: a wrong verifier or code was tried (refused for good); redeemed: the token was issued.
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'signed_in', 'approved', 'denied', 'spent', 'redeemed')),
    browser_hash     bytea,                 -- the __Host- cookie of the browser that signed in
    org_id           text,
    linear_user_id   text,
    grant_hash       bytea,                 -- loopback: the one-time code handed to the machine
    grant_expires_at timestamptz,           -- ... valid 60 s
    confirm_hash     bytea,                 -- code mode: the confirm page's CSRF token
    orchestrator_id  uuid REFERENCES orchestrators (id),
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,  -- 10 minutes after it was asked for
    CHECK ((mode = 'loopback') = (loopback_port IS NOT NULL)),
    CHECK ((mode = 'code') = (user_code_hash IS NOT NULL))
);

-- Serves the sweep: enrollments long past their expiry.
CREATE INDEX IF NOT EXISTS enrollments_expires_idx ON enrollments (expires_at);

-- One browser's trip through Linear's sign-in: the `state` it carries (hashed; used once), the
-- browser's cookie it must come back with, and what it is for (an enrollment, or a /me session).
CREATE TABLE IF NOT EXISTS signin_flows (
    state_hash     bytea PRIMARY KEY,
    browser_hash   bytea NOT NULL,
    purpose        text NOT NULL CHECK (purpose IN ('enroll', 'me')),
    enrollment_id  uuid REFERENCES enrollments (id) ON DELETE CASCADE,
    created_at     timestamptz NOT NULL DEFAULT now(),
    expires_at     timestamptz NOT NULL,
    CHECK ((purpose = 'enroll') = (enrollment_id IS NOT NULL))
);

CREATE INDEX IF NOT EXISTS signin_flows_expires_idx ON signin_flows (expires_at);

-- A person signed in with Linear on /me (the cookie holds the token; this table its hash).
CREATE TABLE IF NOT EXISTS people_sessions (
    token_hash      bytea PRIMARY KEY,
    org_id          text NOT NULL,
    linear_user_id  text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL
);

-- Who signed in, as Linear said at their last sign-in: the names `whoami` and /me show.
CREATE TABLE IF NOT EXISTS linear_people (
    org_id          text NOT NULL,
    linear_user_id  text NOT NULL,
    name            text NOT NULL,
    workspace_name  text NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, linear_user_id)
);

-- Public routes' limits per client (enrollments asked for, wrong codes typed): hits in a window.
CREATE TABLE IF NOT EXISTS rate_limits (
    key           text PRIMARY KEY,
    hits          integer NOT NULL,
    window_start  timestamptz NOT NULL
);

-- Serves re-enrolling (a person's active machine of that name) and /me (a person's machines).
CREATE INDEX IF NOT EXISTS orchestrators_person_idx
    ON orchestrators (org_id, linear_user_id, name) WHERE revoked_at IS NULL;
