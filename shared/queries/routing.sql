-- Routing that asks Linear first (shared/delivery/routing.py): a start whose machine cannot be chosen in
-- the webhook's transaction, because something must be read from Linear (the assignee of an issue
-- whose agent session an automation started). The request is a row written in the webhook's
-- transaction; the Linear read and the routing happen after commit, retried like the outbox.
--
-- States of a request: OPEN (done_at IS NULL; due once available_at <= now, and not while another
-- routing holds its lease) -> DONE (done_at set, with its outcome), exactly once, in the
-- transaction that queues its message or tells Linear why nothing can take it (`routing_done`);
-- or by a stop of its agent session (`routing_cancel_agent_session`); or given up past the attempt
-- limit (`routing_failed`).

-- name: routing_request_insert
-- In the webhook's transaction: the request commits with the delivery's record or not at all, so
-- a session Linear was answered 200 for is never lost.
INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message, delivery_key,
                              linear_user_id)
VALUES (%(org_id)s, %(agent_session_id)s, %(issue_id)s, %(need)s, %(message)s, %(delivery_key)s,
        %(linear_user_id)s)
RETURNING id;

-- name: routing_take
-- Takes due open requests (those named by id or by agent session, or any when none are named),
-- none of an org that waits for Linear's rate limit (`linear_paces`): SKIP LOCKED and a short
-- lease, so two routers never work on one request at once. In order per agent session: not while
-- an earlier request of the same agent session is open (its follow-up must find the start routed).
WITH due AS (
    SELECT id FROM routing_requests r0
    WHERE done_at IS NULL AND available_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND NOT EXISTS (SELECT 1 FROM linear_paces p WHERE p.org_id = r0.org_id AND p.blocked_until > now())
      AND ((%(ids)s::uuid[] IS NULL AND %(agent_sessions)s::text[] IS NULL)
           OR id = ANY(%(ids)s::uuid[]) OR agent_session_id = ANY(%(agent_sessions)s::text[]))
      AND (r0.agent_session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM routing_requests earlier
            WHERE earlier.org_id = r0.org_id AND earlier.agent_session_id = r0.agent_session_id
              AND earlier.done_at IS NULL AND earlier.seq < r0.seq))
    ORDER BY seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE routing_requests r SET lease_expires_at = now() + interval '30 seconds', attempts = r.attempts + 1
FROM due WHERE r.id = due.id
RETURNING r.id, r.org_id, r.agent_session_id, r.issue_id, r.need, r.message, r.delivery_key,
          r.attempts, r.seq, r.linear_user_id, r.candidates, r.choice;

-- name: routing_lock_open
-- In the routing transaction, after the agent session's turn: the request, locked, if it is still
-- open (a stop may have cancelled it meanwhile; then nothing is written for it).
SELECT id FROM routing_requests WHERE id = %(id)s AND done_at IS NULL FOR UPDATE;

-- name: routing_done
-- Owner: routing (with the webhook's delivery record, in one statement).
-- OPEN -> DONE, compare-and-set, in the transaction that queued its message (`session_id`) or
-- wrote Linear's reason: a second completion changes nothing. The delivery that asked is recorded
-- with what it became.
WITH done AS (
    UPDATE routing_requests
    SET done_at = now(), outcome = %(outcome)s, session_id = %(session_id)s, lease_expires_at = NULL,
        last_error = NULL
    WHERE id = %(id)s AND done_at IS NULL
    RETURNING delivery_key
)
UPDATE webhook_deliveries d SET session_id = %(session_id)s, outcome = %(outcome)s
FROM done WHERE d.delivery_key = done.delivery_key;

-- name: routing_failed
-- Linear could not be asked: due again after devpilot_backoff(attempts), the error kept; past the
-- attempt limit it is given up here (`gave_up`), and the caller tells Linear in this transaction.
UPDATE routing_requests
SET lease_expires_at = NULL, last_error = %(error)s,
    available_at = now() + make_interval(secs => devpilot_backoff(attempts, %(base)s, %(cap)s)),
    done_at = CASE WHEN attempts >= %(max_attempts)s THEN now() END,
    outcome = CASE WHEN attempts >= %(max_attempts)s THEN 'gave_up' END
WHERE id = %(id)s AND done_at IS NULL
RETURNING done_at IS NOT NULL AS gave_up;

-- name: routing_ratelimited
-- Linear refused the read for its rate limit: not an attempt. Due again when the org's wait is
-- over (the attempt taken back), the org's pace recorded in the same statement (`pace_refused`).
WITH paced AS (
-- include: pace_refused
)
UPDATE routing_requests r
SET lease_expires_at = NULL, last_error = %(error)s, attempts = greatest(r.attempts - 1, 0),
    available_at = (SELECT blocked_until FROM paced)
WHERE r.id = %(id)s AND r.done_at IS NULL;

-- name: routing_cancel_agent_session
-- In a transaction of stops (after their agent sessions' turns): the open requests of each agent
-- session of `batch` (a JSON array, one element per stop: `n`, `org_id`, `agent_session_id`) are
-- done, cancelled; a routing that comes later finds them done and writes nothing. Sent after
-- `take_turns`: for each element only when that statement recorded its delivery
-- (`devpilot.verdict_<n>` 'go').
UPDATE routing_requests r SET done_at = now(), outcome = 'cancelled', lease_expires_at = NULL
FROM jsonb_to_recordset(%(batch)s::jsonb) AS w(n int, org_id text, agent_session_id text)
WHERE r.org_id = w.org_id AND r.agent_session_id = w.agent_session_id AND r.done_at IS NULL
  AND current_setting('devpilot.verdict_' || w.n, true) = 'go'
RETURNING r.id;

-- name: agent_session_turn_alone
-- `agent_session_turn` as a statement of the routing transaction: it serialises the routing of an
-- agent session with that session's webhooks (a stop, a follow-up) until commit.
-- include: agent_session_turn
;

-- name: agent_session_holder
-- In the routing transaction, after the agent session's turn (`agent_session_turn_alone`): the
-- machine that holds the agent session, and the issue it is about (`devpilot_agent_session_holder`,
-- migration 0013, which says who holds one; `follow_ups_for_delivery` reads it the same way). Also
-- routing's hint, outside any turn, which reads none while another transaction has the turn.
SELECT orchestrator_id, issue_id, issue_identifier, opened_for
FROM devpilot_agent_session_holder(%(org_id)s, %(agent_session_id)s, %(delivered_only)s);

-- name: routed_machine
-- The routing policy (`route`) for one (org, Linear user), as a statement: the machine a start
-- goes to, or no row.
SELECT r.id FROM (SELECT %(org_id)s::text AS org_id, %(route_user)s::text AS route_user) want, LATERAL (
-- include: route
) r;

-- name: user_machines
-- The user's active machines and what each has, most recently seen first (as `route` orders
-- them): what routing by repository chooses among. Served by orchestrators_route_idx.
SELECT o.id, o.name, o.routing_shape, coalesce(i.repositories, '[]') AS repositories,
       coalesce(i.repository_keys, '{}') AS repository_keys, coalesce(i.labels, '{}') AS labels
FROM orchestrators o LEFT JOIN machine_inventories i ON i.orchestrator_id = o.id
WHERE o.org_id = %(org_id)s AND o.linear_user_id = %(route_user)s AND o.revoked_at IS NULL
ORDER BY o.last_seen_at DESC NULLS LAST, o.created_at DESC, o.id;

-- name: repository_machine
-- In the routing transaction: the machine a start routed by repository goes to: the user's most
-- recently seen active machine among `ids` (the label rule's; NULL: any) that has the repository
-- `repository` (a key, `host/owner/name`; NULL: any). No row: none has it (any more).
SELECT o.id, o.name FROM orchestrators o
WHERE o.org_id = %(org_id)s AND o.linear_user_id = %(route_user)s AND o.revoked_at IS NULL
  AND (%(ids)s::uuid[] IS NULL OR o.id = ANY(%(ids)s::uuid[]))
  AND (%(repository)s::text IS NULL OR EXISTS (
        SELECT 1 FROM machine_inventories i
        WHERE i.orchestrator_id = o.id AND i.repository_keys @> ARRAY[%(repository)s::text]))
ORDER BY o.last_seen_at DESC NULLS LAST, o.created_at DESC, o.id
LIMIT 1;

-- name: routing_ask
-- Owner: routing (with Linear's notice, the question, in one statement).
-- OPEN -> OPEN, asked: in the routing transaction, the person is asked which repository (Linear's
-- `select` elicitation, into the outbox with it). The request stays open but is not due until the
-- answer comes (`follow_ups_for_delivery`); the candidates asked about are kept to read the answer by.
WITH asked AS (
    UPDATE routing_requests
    SET asked_at = now(), candidates = %(candidates)s, choice = NULL, available_at = 'infinity',
        lease_expires_at = NULL, last_error = NULL
    WHERE id = %(id)s AND done_at IS NULL
    RETURNING org_id, agent_session_id, issue_id
)
INSERT INTO linear_notices (org_id, kind, agent_session_id, issue_id, body, content, signal, signal_metadata)
SELECT org_id, 'dispatched', agent_session_id, issue_id, %(body)s,
       jsonb_build_object('type', 'elicitation', 'body', %(body)s::text), 'select', %(options)s
FROM asked
WHERE agent_session_id IS NOT NULL AND EXISTS (SELECT FROM devpilot_notified(org_id))
RETURNING id;
