-- Every query of the dispatch core, one named block each (`-- name: <name>`), in the style of
-- Procrastinate's queries.sql. The line under each name says what the statement guarantees.
-- Parameters are psycopg named placeholders. `now` is NULL in production (the database clock) and
-- a fixed instant in tests that drive the clock.

-- name: insert_session
-- Creates the session in state `queued`; the deferred invariant trigger requires its queue row to
-- be inserted in the same transaction (enqueue_dispatch) before commit.
INSERT INTO dispatch_sessions (id, org_id, orchestrator_id, status, linear_user_id, issue_id,
                               issue_identifier, agent_session_id)
VALUES (%(id)s, %(org_id)s, %(orchestrator_id)s, 'queued', %(linear_user_id)s, %(issue_id)s,
        %(issue_identifier)s, %(agent_session_id)s)
RETURNING id;

-- name: enqueue
-- Inserts the queue row and copies its ids onto the session, in the caller's transaction; the
-- NOTIFY is delivered by Postgres only if that transaction commits, so rolled-back work wakes no one.
WITH q AS (
    INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload, available_at)
    VALUES (%(session_id)s, %(orchestrator_id)s, %(org_id)s, %(payload)s,
            coalesce(%(now)s::timestamptz, now()))
    RETURNING id, message_id, session_id, orchestrator_id
), s AS (
    -- By primary key only (the org and state are checked by the caller on what it returns), so the
    -- planner cannot wander into another index of a freshly filled, not yet analysed table.
    UPDATE dispatch_sessions ds SET queue_id = q.id, message_id = q.message_id
    FROM q WHERE ds.id = %(session_id)s
    RETURNING ds.org_id, ds.status, ds.orchestrator_id
)
SELECT q.id AS queue_id, q.message_id, s.org_id AS session_org_id, s.status AS session_status,
       s.orchestrator_id = q.orchestrator_id AS same_orchestrator,
       pg_notify('devpilot_dispatch', q.orchestrator_id::text) AS notified
FROM q LEFT JOIN s ON true;

-- name: claim
-- Exactly-once: locks up to `max` due, unclaimed rows of one orchestrator (skipping rows another
-- claimer holds), in due order, and gives each a fresh claim token and lease in the same statement.
-- The CTE pins the LIMIT so the UPDATE touches no more rows than were selected.
WITH due AS (
    SELECT id
    FROM dispatch_queue
    WHERE orchestrator_id = %(orchestrator_id)s
      AND lease_expires_at IS NULL
      AND available_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY available_at, id
    LIMIT %(max)s
    FOR UPDATE SKIP LOCKED
)
UPDATE dispatch_queue q
SET attempts = q.attempts + 1,
    claim_token = gen_random_uuid(),
    claimed_at = coalesce(%(now)s::timestamptz, now()),
    lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s)
FROM due
WHERE q.id = due.id
RETURNING q.id, q.session_id, q.orchestrator_id, q.org_id, q.message_id, q.payload, q.attempts,
          q.claim_token, q.lease_expires_at, q.available_at, q.created_at;

-- name: touch_orchestrator
-- Records that the orchestrator was seen; routing prefers the most recently seen. At most one
-- write a second per machine, so idle polls and concurrent claimers cost a read, not a row update.
UPDATE orchestrators SET last_seen_at = now()
WHERE id = %(orchestrator_id)s AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second');

-- name: ack
-- One statement, so one atomic step: deletes each row only while it still carries the given claim
-- token (compare-and-set; zero rows means gone or superseded, never an overwrite) and marks the
-- sessions of exactly the deleted rows `delivered`. Serves the single and the batch form.
WITH items AS (
    SELECT * FROM unnest(%(queue_ids)s::uuid[], %(claim_tokens)s::uuid[]) AS t(queue_id, claim_token)
), deleted AS (
    DELETE FROM dispatch_queue q
    USING items i
    WHERE q.id = i.queue_id AND q.orchestrator_id = %(orchestrator_id)s AND q.claim_token = i.claim_token
    RETURNING q.id, q.session_id, q.claim_token
), delivered AS (
    UPDATE dispatch_sessions s
    SET status = 'delivered', acked_claim_token = d.claim_token, delivered_at = now(), updated_at = now()
    FROM deleted d
    WHERE s.id = d.session_id AND s.status = 'queued'
    RETURNING s.id, s.org_id, s.agent_session_id, s.issue_id, s.orchestrator_id
), notices AS (
    -- "picked up by <machine>" for agent sessions of orgs that gave us Linear credentials
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
    SELECT d.org_id, d.id, 'delivered', d.agent_session_id, d.issue_id, 'Picked up by ' || o.name
    FROM delivered d JOIN orchestrators o ON o.id = d.orchestrator_id
    WHERE d.agent_session_id IS NOT NULL
      AND EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = d.org_id)
    RETURNING id
)
SELECT id AS queue_id, claim_token, (SELECT array_agg(id) FROM notices) AS notice_ids FROM deleted;

-- name: ack_explain_miss
-- After a compare-and-set missed: tells a repeated ack (session delivered by this very token) from a
-- superseded token (the row, or its delivery, belongs to a newer claim) and from a row this
-- orchestrator never had. Scoped to the orchestrator, so another's row reads as none. Read-only.
SELECT q.claim_token AS live_token, q.available_at AS live_available_at,
       s.status AS session_status, s.acked_claim_token AS acked_token
FROM (SELECT 1) AS one
LEFT JOIN dispatch_queue q ON q.id = %(queue_id)s AND q.orchestrator_id = %(orchestrator_id)s
LEFT JOIN dispatch_sessions s ON s.queue_id = %(queue_id)s AND s.orchestrator_id = %(orchestrator_id)s;

-- name: release
-- Compare-and-set: ends the live claim of this token now as a failed attempt: back to unclaimed
-- with backoff, or (at the attempt limit) dead-lettered with its session failed, in one statement.
WITH target AS (
    SELECT id, session_id, attempts
    FROM dispatch_queue
    WHERE id = %(queue_id)s AND orchestrator_id = %(orchestrator_id)s
      AND claim_token = %(claim_token)s AND lease_expires_at IS NOT NULL
    FOR UPDATE
), dead AS (
    DELETE FROM dispatch_queue q USING target t
    WHERE q.id = t.id AND t.attempts >= %(max_attempts)s
    RETURNING q.session_id
), failed AS (
    UPDATE dispatch_sessions s
    SET status = 'failed', updated_at = now(),
        failure_reason = 'released ' || %(max_attempts)s::text || ' times: ' || coalesce(%(reason)s, 'no reason given')
    FROM dead WHERE s.id = dead.session_id AND s.status = 'queued'
    RETURNING s.id, s.org_id, s.agent_session_id, s.issue_id, s.failure_reason
), notices AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
    SELECT f.org_id, f.id, 'failed', f.agent_session_id, f.issue_id, 'No machine took this: ' || f.failure_reason
    FROM failed f WHERE EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = f.org_id)
    RETURNING id
), requeued AS (
    UPDATE dispatch_queue q
    SET lease_expires_at = NULL, claimed_at = NULL, last_error = %(reason)s,
        available_at = coalesce(%(now)s::timestamptz, now())
                       + make_interval(secs => least(t.attempts * t.attempts * %(base)s, %(cap)s))
    FROM target t
    WHERE q.id = t.id AND t.attempts < %(max_attempts)s
    RETURNING q.available_at
)
SELECT (SELECT count(*) FROM target) AS matched,
       (SELECT available_at FROM requeued) AS available_at,
       (SELECT count(*) FROM failed) AS failed,
       (SELECT array_agg(id) FROM notices) AS notice_ids;

-- name: sweep
-- One set-based statement over expired leases. Rows an ack (or release, or another sweep) is
-- touching are skipped (SKIP LOCKED), so a sweep and an ack never both win and two sweeps never
-- count a row twice. Attempt n is re-queued at now + min(n² × base, cap); at n ≥ max attempts the
-- row is deleted and its session failed in this same statement.
WITH expired AS (
    SELECT id, session_id, attempts
    FROM dispatch_queue
    WHERE lease_expires_at IS NOT NULL
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), dead AS (
    DELETE FROM dispatch_queue q USING expired e
    WHERE q.id = e.id AND e.attempts >= %(max_attempts)s
    RETURNING q.session_id
), failed AS (
    UPDATE dispatch_sessions s
    SET status = 'failed', updated_at = now(),
        failure_reason = 'no ack after ' || %(max_attempts)s::text || ' delivery attempts'
    FROM dead WHERE s.id = dead.session_id AND s.status = 'queued'
    RETURNING s.id, s.org_id, s.agent_session_id, s.issue_id, s.failure_reason
), notices AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
    SELECT f.org_id, f.id, 'failed', f.agent_session_id, f.issue_id, 'No machine took this: ' || f.failure_reason
    FROM failed f WHERE EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = f.org_id)
    RETURNING id
), requeued AS (
    UPDATE dispatch_queue q
    SET lease_expires_at = NULL, claimed_at = NULL, last_error = 'lease expired',
        available_at = coalesce(%(now)s::timestamptz, now())
                       + make_interval(secs => least(e.attempts * e.attempts * %(base)s, %(cap)s))
    FROM expired e
    WHERE q.id = e.id AND e.attempts < %(max_attempts)s
    RETURNING q.id
)
SELECT (SELECT count(*) FROM requeued) AS requeued,
       (SELECT count(*) FROM dead) AS dead_lettered,
       (SELECT count(*) FROM failed) AS failed,
       (SELECT count(*) FROM notices) AS notices;

-- name: record_sweep
-- Bookkeeping only: when the sweep ran and what it did (operators' view).
INSERT INTO sweep_runs (requeued, dead_lettered) VALUES (%(requeued)s, %(dead_lettered)s);

-- name: cancel_open_issue
-- Cancels the issue's still-undelivered dispatch (queued or claimed, not yet acked) in the caller's
-- transaction: the queue row is deleted and the session set `cancelled` together. Locks the queue
-- row first, in the same order as ack, sweep and release, so a racing ack either wins (nothing is
-- cancelled) or finds the row gone (404); never a deadlock, never both.
WITH q AS (
    DELETE FROM dispatch_queue dq
    USING dispatch_sessions s
    WHERE dq.session_id = s.id
      AND s.org_id = %(org_id)s AND s.issue_id = %(issue_id)s AND s.status = 'queued'
      AND (%(linear_user_id)s::text IS NULL OR s.linear_user_id = %(linear_user_id)s::text)
    RETURNING dq.session_id
)
UPDATE dispatch_sessions ds
SET status = 'cancelled', updated_at = now(), failure_reason = %(reason)s
FROM q WHERE ds.id = q.session_id AND ds.status = 'queued'
RETURNING ds.id;

-- name: record_delivery
-- Idempotency as a constraint: the first transaction to insert a delivery key wins; a concurrent
-- duplicate waits on the key and then inserts nothing (no "select, then insert" race).
INSERT INTO webhook_deliveries (delivery_key) VALUES (%(key)s)
ON CONFLICT (delivery_key) DO NOTHING
RETURNING delivery_key;

-- name: delivery_session
-- For a duplicate: the session the first delivery created (committed, so visible here).
SELECT session_id, outcome FROM webhook_deliveries WHERE delivery_key = %(key)s;

-- name: finish_delivery
-- In the intake transaction: what the delivery did, committed with its rows.
UPDATE webhook_deliveries SET session_id = %(session_id)s, outcome = %(outcome)s
WHERE delivery_key = %(key)s;

-- name: notice_insert
-- In the caller's transaction: the notice commits with the state change that causes it, or not at all.
INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
VALUES (%(org_id)s, %(session_id)s, %(kind)s, %(agent_session_id)s, %(issue_id)s, %(body)s)
RETURNING id;

-- name: notice_take
-- Takes due, unsent notices (those named, or any when none are named) for sending: SKIP LOCKED and
-- a short lease, so two senders never post the same notice at once.
WITH due AS (
    SELECT id FROM linear_notices
    WHERE sent_at IS NULL AND available_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
    ORDER BY available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE linear_notices n SET lease_expires_at = now() + interval '30 seconds', attempts = n.attempts + 1
FROM due WHERE n.id = due.id
RETURNING n.id, n.org_id, n.kind, n.agent_session_id, n.issue_id, n.body, n.attempts,
          (SELECT token_encrypted FROM linear_credentials c WHERE c.org_id = n.org_id) AS token_encrypted;

-- name: notice_sent
-- Compare-and-set: marks it sent once, with Linear's id; a second success changes nothing.
UPDATE linear_notices SET sent_at = now(), linear_id = %(linear_id)s, lease_expires_at = NULL, last_error = NULL
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_failed
-- A failed send: due again after min(n² × base, cap); past the attempt limit it is given up
-- (sent_at stays NULL, available_at far away) with the error kept for operators.
UPDATE linear_notices
SET lease_expires_at = NULL, last_error = %(error)s,
    available_at = CASE WHEN attempts >= %(max_attempts)s THEN 'infinity'::timestamptz
                        ELSE now() + make_interval(secs => least(attempts * attempts * %(base)s, %(cap)s)) END
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_dispatched
-- In the intake transaction: "queued for <machine>" for an agent session, when the org gave us
-- Linear credentials (Linear shows the agent unresponsive without an activity within 10 s).
INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
SELECT %(org_id)s, %(session_id)s, 'dispatched', %(agent_session_id)s, %(issue_id)s, 'Queued for ' || o.name
FROM orchestrators o
WHERE o.id = %(orchestrator_id)s AND EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = %(org_id)s)
RETURNING id;
