-- Connection-level statements: health, timeouts, and the migration ledger.

-- name: ping
-- Health: the database answers.
SELECT 1;

-- name: read_only
-- Inside a transaction: it may not write (operators' snapshots).
SET TRANSACTION READ ONLY;

-- name: set_local_settings
-- The server-side settings for this transaction only: behind a transaction-mode pooler, where session
-- settings do not stick, the ones a direct connection gets at its start (shared.plumbing.db.session_options):
-- the limits, and no JIT compilation; and where one transaction must wait longer than the hot path
-- may (a token refresh waits on Linear).
SELECT set_config('statement_timeout', %(statement_ms)s::text, true),
       set_config('lock_timeout', %(lock_ms)s::text, true),
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true),
       set_config('jit', 'off', true);

-- name: migrations_try_lock
-- Serialises concurrent `devpilot migrate` runs: the run's lock, on its connection (the key a
-- release before took for its transaction, so the two exclude each other too). Tried, not waited
-- for inside the statement (shared/plumbing/migrate.py says why).
SELECT pg_try_advisory_lock(%(key)s) AS locked;

-- name: migrations_unlock
SELECT pg_advisory_unlock(%(key)s);

-- name: migrations_lock_timeout
-- In a migration's transaction: how long each of its statements may wait for a lock.
SELECT set_config('lock_timeout', %(ms)s::text, true);

-- name: migrations_no_limits
-- Before a no-transaction migration, on the runner's own connection: a concurrent index build
-- waits for the transactions already running, as long as they run.
SELECT set_config('lock_timeout', '0', false), set_config('statement_timeout', '0', false);

-- name: migrations_invalid_index
-- An index of this name in the current schema that a concurrent build left INVALID (interrupted):
-- dropped before it is built again.
SELECT c.relname AS name
FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
WHERE c.relname = %(name)s AND c.relnamespace = current_schema()::regnamespace AND NOT i.indisvalid;

-- name: migrations_ledger
CREATE TABLE IF NOT EXISTS devpilot_migrations (
    version     text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version, checksum FROM devpilot_migrations;

-- name: migrations_record
-- In the transaction that applied the file: a failed file leaves no record and is retried. (A
-- no-transaction file: after its last statement; one interrupted before is run again, whole.)
INSERT INTO devpilot_migrations (version, checksum) VALUES (%(version)s, %(checksum)s);

-- name: migrations_has_supabase
-- Supabase's schemas are there: its Realtime publication and row-level security apply.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'realtime')
       AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated') AS ok;

-- name: listen
-- On the one direct (or session-mode) connection per instance: the `enqueue` statement's NOTIFY
-- on this channel wakes long-polls. A hint only; the table stays the truth.
LISTEN devpilot_dispatch;
