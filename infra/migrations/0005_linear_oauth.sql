-- 0005: a Linear workspace connected with OAuth (actor=app). Linear's access tokens live about a
-- day; the refresh token (rotated on use) renews them. Both are stored encrypted by the service.

ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'static'
    CHECK (kind IN ('static', 'oauth'));           -- static: pasted in by an operator, never refreshed
ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS refresh_token_encrypted bytea;
ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS expires_at timestamptz;
ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS workspace_name text;
-- Set when Linear refused a refresh or the app was uninstalled: posts wait in the outbox (not
-- dropped) until a new install clears it.
ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS disconnected_at timestamptz;
ALTER TABLE linear_credentials ADD COLUMN IF NOT EXISTS disconnect_reason text;
