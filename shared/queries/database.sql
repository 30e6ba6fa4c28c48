-- Connection-level statements: health, timeouts, and the migration ledger.

-- name: ping
-- Health: the database answers.
SELECT 1;

-- name: read_only
-- Inside a transaction: it may not write (operators' snapshots).
SET TRANSACTION READ ONLY;

-- name: set_local_settings
-- The server-side settings for this transaction only: behind a transaction-mode pooler, where session
-- settings do not stick, the ones a direct connection gets at its start (shared.db.session_options):
-- the limits, and no JIT compilation; and where one transaction must wait longer than the hot path
-- may (a token refresh waits on Linear).
SELECT set_config('statement_timeout', %(statement_ms)s::text, true),
       set_config('lock_timeout', %(lock_ms)s::text, true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true),
       set_config('jit', 'off', true);

-- name: migrations_lock
-- Serialises concurrent `devpilot migrate` runs for the rest of the transaction.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migrations_ledger
CREATE TABLE IF NOT EXISTS devpilot_migrations (
    version     text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version, checksum FROM devpilot_migrations;

-- name: migrations_record
-- In the transaction that applied the file: a failed file leaves no record and is retried.
INSERT INTO devpilot_migrations (version, checksum) VALUES (%(version)s, %(checksum)s);

-- name: migrations_has_supabase
-- Supabase's schemas are there: its Realtime publication and row-level security apply.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'realtime')
       AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated') AS ok;

-- name: listen
-- On the one direct (or session-mode) connection per instance: the `enqueue` statement's NOTIFY
-- on this channel wakes long-polls. A hint only; the table stays the truth.
LISTEN devpilot_dispatch;
