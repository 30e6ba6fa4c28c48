-- 0002: telling Linear what happened, through a table too (never a dual write).
-- A notice row is written in the same transaction as the state change that causes it; after
-- commit the handler tries to send it at once, and the sweep sends whatever is still pending.

-- Per-org Linear app access tokens, encrypted by the service (Fernet); never returned or logged.
CREATE TABLE IF NOT EXISTS linear_credentials (
    org_id          text PRIMARY KEY,
    token_encrypted bytea NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS linear_notices (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id           text NOT NULL,
    session_id       uuid REFERENCES dispatch_sessions (id),
    kind             text NOT NULL CHECK (kind IN ('dispatched', 'delivered', 'failed')),
    agent_session_id text,
    issue_id         text,
    body             text NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    -- a sender holds a notice while it talks to Linear; another sender skips it until then
    lease_expires_at timestamptz,
    sent_at          timestamptz,
    linear_id        text,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Serves the sweep's pending sends: unsent notices by due time.
CREATE INDEX IF NOT EXISTS linear_notices_pending_idx
    ON linear_notices (available_at) WHERE sent_at IS NULL;
