-- 0001: the dispatch core. The delivery guarantee of the product is the dispatch_queue table:
-- a session is `queued` exactly while one queue row holds it, and that is enforced at commit below.

CREATE TABLE IF NOT EXISTS orchestrators (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id          text NOT NULL,
    linear_user_id  text NOT NULL,
    name            text NOT NULL,
    -- sha256 of the bearer token; the token itself is shown once and never stored.
    token_hash      bytea NOT NULL UNIQUE,
    revoked_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz
);

-- Serves routing: the active orchestrator for (org, Linear user), most recently seen first.
CREATE INDEX IF NOT EXISTS orchestrators_route_idx
    ON orchestrators (org_id, linear_user_id, last_seen_at DESC NULLS LAST)
    WHERE revoked_at IS NULL;

CREATE TABLE IF NOT EXISTS dispatch_sessions (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    org_id              text NOT NULL,
    orchestrator_id     uuid NOT NULL REFERENCES orchestrators (id),
    status              text NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'delivered', 'failed', 'cancelled')),
    linear_user_id      text,
    issue_id            text,
    issue_identifier    text,
    agent_session_id    text,
    -- The queue row's id (queueId) stays here after the row is deleted, so a repeated ack of the
    -- claim that delivered it can still be recognised and answered `acked`.
    queue_id            uuid UNIQUE,
    message_id          uuid UNIQUE,
    acked_claim_token   uuid,
    failure_reason      text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    delivered_at        timestamptz
);

-- Serves cancellation on re-assignment: the still-queued session of one issue in one org.
CREATE INDEX IF NOT EXISTS dispatch_sessions_open_issue_idx
    ON dispatch_sessions (org_id, issue_id) WHERE status = 'queued';
-- Serves operators' views of recent failures.
CREATE INDEX IF NOT EXISTS dispatch_sessions_status_idx
    ON dispatch_sessions (status, updated_at DESC);

-- The hot table holds only live work: rows are deleted on ack, cancel and dead letter.
-- fillfactor leaves room for HOT updates on claim/requeue; aggressive autovacuum keeps the
-- dead index entries left by deletes from piling up in front of the claim index.
CREATE TABLE IF NOT EXISTS dispatch_queue (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    session_id          uuid NOT NULL UNIQUE REFERENCES dispatch_sessions (id),
    orchestrator_id     uuid NOT NULL REFERENCES orchestrators (id),
    org_id              text NOT NULL,
    message_id          uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    payload             jsonb NOT NULL,
    attempts            integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    available_at        timestamptz NOT NULL DEFAULT now(),
    -- The latest claim's fencing token. Kept when the sweep re-queues the row, so that claim can
    -- still ack until a newer claim replaces the token.
    claim_token         uuid,
    claimed_at          timestamptz,
    -- NULL = unclaimed (claimable once available_at has passed); set = a lease is held.
    lease_expires_at    timestamptz,
    last_error          text,
    created_at          timestamptz NOT NULL DEFAULT now()
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 200,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02
);

-- Serves the claim: one orchestrator's unclaimed rows in due order. Exactly the claim's predicate
-- and ORDER BY, so an empty poll is an index probe that finds nothing.
CREATE INDEX IF NOT EXISTS dispatch_queue_claim_idx
    ON dispatch_queue (orchestrator_id, available_at, id)
    WHERE lease_expires_at IS NULL;

-- Serves the sweep: only rows holding a lease, by expiry; healthy unclaimed rows are not in it.
CREATE INDEX IF NOT EXISTS dispatch_queue_lease_idx
    ON dispatch_queue (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

-- Linear deliveries already seen. The primary key is the idempotency: INSERT ... ON CONFLICT DO
-- NOTHING in the intake transaction, never "select, then insert".
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    delivery_key    text PRIMARY KEY,
    session_id      uuid,
    outcome         text NOT NULL DEFAULT 'pending',
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- Serves pruning of old delivery ids (Linear retries for at most ~7 h).
CREATE INDEX IF NOT EXISTS webhook_deliveries_received_idx ON webhook_deliveries (received_at);

-- Bookkeeping for operators: when the sweep last ran and what it did.
CREATE TABLE IF NOT EXISTS sweep_runs (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ran_at          timestamptz NOT NULL DEFAULT now(),
    requeued        integer NOT NULL,
    dead_lettered   integer NOT NULL
);

-- The contract's invariant, checked at every commit: a session is `queued` if and only if exactly
-- one dispatch_queue row has its id. (The UNIQUE on session_id gives "at most one"; the foreign key
-- gives "no queue row lacks its session".) A deferred constraint trigger sees the whole
-- transaction's result, so a correct transaction may pass through intermediate states.
CREATE OR REPLACE FUNCTION devpilot_check_session_invariant() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    sid uuid;
    st  text;
    has_row boolean;
BEGIN
    IF TG_TABLE_NAME = 'dispatch_sessions' THEN
        sid := NEW.id;
    ELSIF TG_OP = 'DELETE' THEN
        sid := OLD.session_id;
    ELSE
        sid := NEW.session_id;
    END IF;
    SELECT s.status INTO st FROM dispatch_sessions s WHERE s.id = sid;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    has_row := EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.session_id = sid);
    IF (st = 'queued') <> has_row THEN
        RAISE EXCEPTION 'dispatch invariant violated: session % is % with % queue row',
            sid, st, CASE WHEN has_row THEN 'a' ELSE 'no' END
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS dispatch_sessions_invariant ON dispatch_sessions;
CREATE CONSTRAINT TRIGGER dispatch_sessions_invariant
    AFTER INSERT OR UPDATE OF status ON dispatch_sessions
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION devpilot_check_session_invariant();

DROP TRIGGER IF EXISTS dispatch_queue_invariant ON dispatch_queue;
CREATE CONSTRAINT TRIGGER dispatch_queue_invariant
    AFTER INSERT OR DELETE ON dispatch_queue
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION devpilot_check_session_invariant();
