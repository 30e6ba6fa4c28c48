-- The dispatch queue: every statement that writes `dispatch_queue`, one named block each
-- (`-- name: <name>`), in the style of Procrastinate's queries.sql. The lines under each name say
-- what the statement guarantees. Parameters are psycopg named placeholders; `now` is NULL in
-- production (the database clock) and a fixed instant in tests that drive the clock.
--
-- States of a queue row (the session is `queued` exactly while its row exists; the deferred
-- invariant trigger of migration 0001 checks that at every commit):
--
--   AVAILABLE  lease_expires_at IS NULL. Claimable once available_at <= now.
--              leaves by: claim (-> CLAIMED), issue_changes_for_delivery (-> deleted, session cancelled)
--   CLAIMED    lease_expires_at IS NOT NULL; claim_token is the fencing token of the latest claim.
--              leaves by: ack (-> deleted, session delivered),
--                         release / sweep, attempts < max (-> AVAILABLE after the backoff),
--                         release / sweep, attempts >= max (-> deleted, session failed),
--                         issue_changes_for_delivery (-> deleted, session cancelled)
--
-- A re-queued row keeps the claim token of its latest claim, so that claim can still ack (a laptop
-- that wakes late still delivers) until a newer claim replaces the token.

-- name: enqueue
-- (none) -> AVAILABLE. Creates a `queued` session and its queue row in one statement, in the
-- caller's transaction: neither can exist without the other, and the deferred invariant trigger
-- checks that again at commit. One statement instead of two is one round trip less on every
-- webhook. The session is written once with the queue row's id and message id already chosen (an
-- update that changes two unique columns is never HOT). The queue row's foreign key to its
-- session is checked at the end of the statement, when the session row inserted above is visible.
--
-- Only for an active machine: `target` reads the machine's row FOR KEY SHARE (the lock the queue
-- row's foreign key takes on it anyway) and writes nothing when it is revoked, and the caller is
-- told (no row returned). That lock and the revoke's FOR UPDATE (`orchestrator_revoke`) wait for
-- each other: either this transaction commits first, and the revoke, which looks at the
-- machine's rows only once it holds the lock, moves or cancels this one with the rest; or the
-- revoke committed first, and this locking read judges the newest row version (revoked), even
-- when its snapshot is older. No interleaving leaves work on a machine that can never claim it.
--
-- The NOTIFY goes only to a machine that is long-polling (`listening_until`, set by
-- `mark_listening` before the long-poll's first look). Postgres delivers it only if this
-- transaction commits, so rolled-back work wakes no one; and it serialises the commits of notifying
-- transactions, which is why a machine nobody waits on gets none. The same lock orders it against
-- a concurrent `mark_listening` (FOR UPDATE): either this transaction commits before the mark
-- does, and the long-poll's first look (after the mark) sees the row; or the mark committed first,
-- and this locking read sees its newest value and notifies. No interleaving leaves a long-poll
-- asleep while work waits for it.
WITH
-- include: enqueue_rows
SELECT q.session_id, q.id AS queue_id, q.message_id,
       (SELECT count(pg_notify('devpilot_dispatch', t.id::text)) FROM target t WHERE t.listening) AS notified
FROM q;

-- name: enqueue_for_delivery
-- `enqueue` for the webhook intake: the same rows, and in the same statement the webhook delivery
-- (`delivery_key`, inserted by `record_delivery` earlier in this transaction) recorded as
-- dispatched to the new session: one round trip less per dispatched webhook. (A statement of its
-- own: the delivery's UPDATE, even one that matches nothing, costs every other enqueue.)
WITH
-- include: enqueue_rows
,
-- include: delivery_dispatched
SELECT q.session_id, q.id AS queue_id, q.message_id,
       (SELECT count(pg_notify('devpilot_dispatch', t.id::text)) FROM target t WHERE t.listening) AS notified
FROM q;

-- name: enqueue_start_for_delivery
-- `enqueue_for_delivery` for the start of an agent session, and in the same statement the
-- "Queued for <machine>" thought for Linear (which shows the agent unresponsive without an
-- activity within 10 s), for orgs Linear is told about: one round trip less per `created`
-- webhook. The notice commits with the message or not at all; it is posted after the commit.
WITH
-- include: enqueue_rows
,
-- include: delivery_dispatched
,
-- include: queued_notice
SELECT q.session_id, q.id AS queue_id, q.message_id, (SELECT id FROM told) AS notice_id,
       (SELECT count(pg_notify('devpilot_dispatch', t.id::text)) FROM target t WHERE t.listening) AS notified
FROM q;

-- name: delivery_dispatched
-- A fragment, after `enqueue_rows`: the webhook delivery `delivery_key` recorded as dispatched to
-- the new session `q`.
delivered AS (
    UPDATE webhook_deliveries d SET session_id = q.session_id, outcome = 'dispatched'
    FROM q WHERE d.delivery_key = %(delivery_key)s
)

-- name: enqueue_rows
-- A fragment, the CTEs of `enqueue`, `enqueue_for_delivery` and `enqueue_start_for_delivery` (see
-- `enqueue`): `target` (the machine's row, locked, if active), `s` (the session) and `q` (its row).
target AS (
    SELECT id, name, listening_until > now() AS listening
    FROM orchestrators WHERE id = %(orchestrator_id)s AND revoked_at IS NULL
    FOR KEY SHARE
),
-- include: enqueue_session_rows

-- name: enqueue_session_rows
-- A fragment, after a CTE `target` (the machine, locked; no row: nothing is written): `s` (the
-- session) and `q` (its queue row), as `enqueue` writes them.
s AS (
    INSERT INTO dispatch_sessions (id, org_id, orchestrator_id, status, linear_user_id, issue_id,
                                   issue_identifier, agent_session_id, kind, queue_id, message_id)
    SELECT %(session_id)s, %(org_id)s, t.id, 'queued', %(linear_user_id)s, %(issue_id)s,
           %(issue_identifier)s, %(agent_session_id)s, %(kind)s, gen_random_uuid(), gen_random_uuid()
    FROM target t
    RETURNING id, queue_id, message_id, orchestrator_id, org_id
), q AS (
    INSERT INTO dispatch_queue (id, message_id, session_id, orchestrator_id, org_id, payload,
                                agent_session_id, available_at)
    SELECT s.queue_id, s.message_id, s.id, s.orchestrator_id, s.org_id, %(payload)s,
           %(agent_session_id)s, coalesce(%(now)s::timestamptz, now())
    FROM s
    RETURNING id, message_id, session_id, orchestrator_id
)

-- name: queued_notice
-- A fragment, after `q` and `target`: with `notice_queued`, Linear's "Queued for <machine>"
-- thought for the agent session's start (Linear shows the agent unresponsive without an activity
-- within 10 s), for an org Linear is told about. It commits with the message or not at all, and
-- is posted after the commit.
told AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body, content)
    SELECT %(org_id)s, q.session_id, 'dispatched', %(agent_session_id)s, %(issue_id)s,
           'Queued for ' || t.name, jsonb_build_object('type', 'thought', 'body', 'Queued for ' || t.name)
    FROM q JOIN target t ON t.id = q.orchestrator_id
    WHERE %(notice_queued)s AND EXISTS (SELECT FROM devpilot_notified(%(org_id)s))
    RETURNING id
)

-- name: claimable
-- A fragment, the `due` CTE of `claim` and `claim_handover`: up to `max` due, unclaimed rows of one
-- active orchestrator (skipping rows another claimer holds), in due order, locked. In order per
-- agent session: a message is not claimable while an earlier message of its agent session is still
-- undelivered (its row, queued or claimed, still exists; dispatch_queue_agent_order_idx). An empty
-- poll never reaches that check: it is a probe of dispatch_queue_claim_idx that finds nothing. A
-- revoked machine claims nothing, even with a request that was authenticated before the revoke.
-- The machine is the preceding CTE `who` (its id; no row: nothing is claimed).
-- Two LIMITs, so that Postgres keeps one plan of the claim instead of planning it at every
-- execution. A bound LIMIT makes the plan kept for every value assume a tenth of the machine's
-- due rows (with a backlog, a hash join over the whole queue), so it was never kept; written into
-- the text, each batch size would be a statement of its own. So `%(max_ceiling)s` is written in
-- by the caller (`shared.plumbing.sql.query_with_limit`): `max` rounded up to a power of two, a handful of
-- statements; and `due` takes the first `max` of those candidates, bound. Rows are locked as
-- `due` pulls them, so no more than `max` are locked. (No ORDER BY in `due`: a sort would pull,
-- and lock, every candidate; the candidates come in the order of their scan.)
candidates AS (
    SELECT id
    FROM dispatch_queue q0
    WHERE orchestrator_id = (SELECT id FROM who)
      AND lease_expires_at IS NULL
      AND available_at <= coalesce(%(now)s::timestamptz, now())
      AND (q0.agent_session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM dispatch_queue earlier
            WHERE earlier.org_id = q0.org_id AND earlier.agent_session_id = q0.agent_session_id
              AND earlier.seq < q0.seq))
      AND EXISTS (SELECT 1 FROM orchestrators o WHERE o.id = (SELECT id FROM who) AND o.revoked_at IS NULL)
    ORDER BY available_at, id
    LIMIT %(max_ceiling)s
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT id FROM candidates LIMIT %(max)s
)

-- name: claim
-- AVAILABLE -> CLAIMED, exactly once: the `claimable` rows get a fresh claim token and lease in the
-- same statement, and the attempt is counted. The CTE pins the LIMIT so the UPDATE touches no more
-- rows than were selected.
WITH who AS (SELECT %(orchestrator_id)s::uuid AS id),
-- include: claimable
-- include: claim_due

-- name: claim_due
-- A fragment, the UPDATE of `claim` and `poll`: AVAILABLE -> CLAIMED for the `due` rows.
UPDATE dispatch_queue q
SET attempts = q.attempts + 1,
    claim_token = gen_random_uuid(),
    claimed_at = coalesce(%(now)s::timestamptz, now()),
    lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s)
FROM due
WHERE q.id = due.id
RETURNING q.id, q.session_id, q.orchestrator_id, q.org_id, q.message_id, q.payload, q.attempts,
          q.claim_token, q.lease_expires_at, q.available_at, q.created_at

-- name: poll
-- The poll route's whole work in one statement (one round trip for an idle machine's poll): who is
-- calling and that it was seen (the `caller` fragment: active machines only), and `claim` for it.
-- One row per claimed message, each carrying the caller; exactly one row with no message when the
-- caller is a machine and nothing is due; no row when the token is no active machine's.
WITH
-- include: caller
,
-- include: claimable
, claimed AS (
-- include: claim_due
)
SELECT who.id AS caller_id, who.org_id AS caller_org_id, who.linear_user_id AS caller_user_id,
       who.name AS caller_name, c.*
FROM who LEFT JOIN claimed c ON true;

-- name: claim_handover
-- AVAILABLE -> AVAILABLE, handed over: what a long-poll claims when work arrives while it waits.
-- Its client may have died mid-wait (killed, lid closed, network gone) and the server cannot tell,
-- least of all on a serverless platform. So the rows get a fresh claim token but stay AVAILABLE:
-- due again `handover_seconds` from now, the attempt not counted. A live client acks with the token
-- well before then (the ack takes the latest token of an AVAILABLE row too); if the client is gone,
-- the orchestrator's next claim after that takes the row at the same attempt. Exactly once still:
-- until then no claim can take it, and after it a late ack with the old token gets claim_superseded.
WITH who AS (SELECT %(orchestrator_id)s::uuid AS id),
-- include: claimable
UPDATE dispatch_queue q
SET claim_token = gen_random_uuid(),
    claimed_at = coalesce(%(now)s::timestamptz, now()),
    available_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(handover_seconds)s)
FROM due
WHERE q.id = due.id
RETURNING q.id, q.session_id, q.orchestrator_id, q.org_id, q.message_id, q.payload,
          q.attempts + 1 AS attempts, q.claim_token, q.available_at AS lease_expires_at,
          q.available_at, q.created_at;

-- name: ack
-- CLAIMED -> deleted, session `delivered`, for the orchestrator `orchestrator_id` (`ack_rows`).
-- Serves the single and the batch form.
WITH who AS (SELECT %(orchestrator_id)s::uuid AS id),
-- include: ack_rows
SELECT id AS queue_id, claim_token, (SELECT array_agg(id) FROM notices) AS notice_ids FROM deleted;

-- name: ack_as
-- The ack route's work in one statement (one round trip for an ack): who is calling and that it
-- was seen (the `caller` fragment: active machines only), and `ack_rows` for it. One row per
-- deleted row, each carrying the caller; exactly one row with no queue id when the caller is a
-- machine and nothing was deleted; no row when the token is no active machine's (nothing deleted).
WITH
-- include: caller
,
-- include: ack_rows
SELECT who.id AS caller_id, who.org_id AS caller_org_id, who.linear_user_id AS caller_user_id,
       who.name AS caller_name, d.id AS queue_id, d.claim_token,
       (SELECT array_agg(id) FROM notices) AS notice_ids
FROM who LEFT JOIN deleted d ON true;

-- name: ack_rows
-- A fragment, after a CTE `who` (the acking orchestrator: one row, or none and nothing is acked).
-- CLAIMED -> deleted, session `delivered`. One statement, so one atomic step: deletes each row only
-- while it still carries the given claim token (compare-and-set; zero rows means gone or superseded,
-- never an overwrite) and marks the sessions of exactly the deleted rows `delivered`.
-- The rows are locked in queue order (seq), whatever the order of the items, as a revoke and a stop
-- lock theirs: a batch ack racing a revoke of its machine (or an overlapping batch in another
-- order) then waits holding nothing the other needs, instead of each waiting for the other.
items AS (
    SELECT * FROM unnest(%(queue_ids)s::uuid[], %(claim_tokens)s::uuid[]) AS t(queue_id, claim_token)
), locked AS (
    SELECT q.id FROM dispatch_queue q, who
    WHERE (q.id, q.claim_token) IN (SELECT queue_id, claim_token FROM items) AND q.orchestrator_id = who.id
    ORDER BY q.seq
    FOR UPDATE OF q
), deleted AS (
    DELETE FROM dispatch_queue q
    USING locked l
    WHERE q.id = l.id
    RETURNING q.id, q.session_id, q.claim_token, q.claimed_at
), delivered AS (
    UPDATE dispatch_sessions s
    SET status = 'delivered', acked_claim_token = d.claim_token, delivered_at = now(), updated_at = now(),
        claimed_at = d.claimed_at
    FROM deleted d
    WHERE s.id = d.session_id AND s.status = 'queued'
    RETURNING s.id, s.org_id, s.agent_session_id, s.issue_id, s.orchestrator_id, s.kind, s.routing_note
),
-- include: delivered_notices

-- name: delivered_notices
-- Owner: the queue (Linear's notices of the delivery, in the ack's statement).
-- A fragment, after `delivered` (the sessions an ack delivered): what Linear hears when a `start`
-- is delivered, for orgs Linear is told about, as outbox rows of the ack's own statement (posted
-- after its commit, retried by the sweep; a refusal never undoes the delivery):
-- * an agent session's start: "Picked up by <machine>", and (with DEVPILOT_PUBLIC_URL) the agent
--   session's link to its page here (`external_urls`);
-- * a plain assignment, in a workspace connected with the app (its app user known): an agent
--   session of its own (`session_create`, with that link), under the alias `devpilot:<sessionId>`
--   until Linear names it, and, when routing by repository chose its machine (`routing_note`),
--   the first activity in it: "Picked up by <machine> — <how it was chosen>" (a plain assignment
--   has no one to ask, so Linear hears the choice here). Written here, not by the routing step:
--   the alias lane exists only once `session_create` is written, and a post under it waits behind
--   that row only if it comes after it (`notice_taking`), which this statement's order (`k.n`, the
--   `seq` it gives) ensures; the agent's own posts under the alias are accepted only after this
--   ack commits, so they come after it too. A start never delivered says nothing in Linear;
-- * either: the issue moved to its team's first started state (`issue_started`) and, with the app
--   user known, the app set as delegate (`delegate`): each decided when posted, after reading the
--   issue (nothing changes when it is started, done or canceled, or has a delegate). Those two are
--   the issue's, outside the agent session's order: their refusal holds back no activity.
notices AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body, content)
    SELECT d.org_id, d.id, k.kind, k.agent_session_id, d.issue_id, k.body, k.content
    FROM (SELECT d0.*, (SELECT c.app_user_id FROM linear_credentials c WHERE c.org_id = d0.org_id) AS app_user_id,
                 jsonb_build_object('externalUrls', jsonb_build_array(jsonb_build_object(
                     'label', 'devpilot', 'url', %(public_url)s::text || '/sessions/' || d0.id::text))) AS links
          FROM delivered d0 WHERE d0.kind = 'start' AND EXISTS (SELECT FROM devpilot_notified(d0.org_id))) d
    JOIN orchestrators o ON o.id = d.orchestrator_id
    CROSS JOIN LATERAL (VALUES
        (1, 'delivered', d.agent_session_id, 'Picked up by ' || o.name, NULL::jsonb,
         d.agent_session_id IS NOT NULL),
        (2, 'external_urls', d.agent_session_id, 'Linked the session page', d.links,
         d.agent_session_id IS NOT NULL AND %(public_url)s::text IS NOT NULL),
        (3, 'session_create', 'devpilot:' || d.id::text, 'Opened an agent session for this assignment',
         CASE WHEN %(public_url)s::text IS NOT NULL THEN d.links ELSE '{}' END,
         d.agent_session_id IS NULL AND d.app_user_id IS NOT NULL),
        (4, 'delivered', 'devpilot:' || d.id::text, 'Picked up by ' || o.name || ' — ' || d.routing_note, NULL,
         d.agent_session_id IS NULL AND d.app_user_id IS NOT NULL AND d.routing_note IS NOT NULL),
        (5, 'issue_started', NULL, 'Moved the issue to started', NULL::jsonb, d.issue_id IS NOT NULL),
        (6, 'delegate', NULL, 'Set the app as delegate', jsonb_build_object('delegateId', d.app_user_id),
         d.issue_id IS NOT NULL AND d.app_user_id IS NOT NULL)
    ) AS k(n, kind, agent_session_id, body, content, wanted)
    WHERE k.wanted
    ORDER BY d.id, k.n
    RETURNING id
)

-- name: ack_explain_miss
-- After a compare-and-set missed: tells a repeated ack (session delivered by this very token) from a
-- superseded token (the row, or its delivery, belongs to a newer claim) and from a row this
-- orchestrator never had. Scoped to the orchestrator, so another's row reads as none. Read-only.
SELECT q.claim_token AS live_token, q.available_at AS live_available_at,
       s.status AS session_status, s.acked_claim_token AS acked_token
FROM (SELECT 1) AS one
LEFT JOIN dispatch_queue q ON q.id = %(queue_id)s AND q.orchestrator_id = %(orchestrator_id)s
LEFT JOIN dispatch_sessions s ON s.queue_id = %(queue_id)s AND s.orchestrator_id = %(orchestrator_id)s;

-- name: end_claims
-- Owner: the queue (with the attempts, dead letters, sessions and Linear's notices, in one statement).
-- A fragment, included by `release` and `sweep` after their `ending` CTE (id, session_id, attempts,
-- claimed_at, last_error, failure_reason: the locked CLAIMED rows whose claim ends without an ack). In their one
-- statement: attempts < max -> AVAILABLE at now + devpilot_backoff(attempts); attempts >= max ->
-- deleted, the session `failed` with its reason, and Linear told (for orgs it is told about).
-- A dead-lettered `start` takes along the messages queued behind it (its agent session's, later
-- in order, on its machine: the follow-ups and stops sent while it waited). No machine has that
-- conversation, so they fail with it (Linear is told once, for the start) rather than reach a
-- machine later as prompts of a conversation it never started; and as no machine holds the agent
-- session then, the user's next follow-up starts it afresh (`agent_session_holder`).
dead AS (
    DELETE FROM dispatch_queue q USING ending e
    WHERE q.id = e.id AND e.attempts >= %(max_attempts)s
    RETURNING q.session_id, q.org_id, q.agent_session_id, q.seq, q.orchestrator_id, e.failure_reason,
              q.payload, q.attempts
), behind AS (
    DELETE FROM dispatch_queue f
    USING dead d, dispatch_sessions ds
    WHERE ds.id = d.session_id AND ds.kind = 'start'
      AND f.org_id = d.org_id AND f.agent_session_id = d.agent_session_id
      AND f.seq > d.seq AND f.orchestrator_id = d.orchestrator_id
    RETURNING f.session_id, f.payload, f.attempts
), tried AS (
    -- Every claim that ends here, kept for the session's page (its time, its error).
    INSERT INTO dispatch_attempts (session_id, attempt, claimed_at, error)
    SELECT e.session_id, e.attempts, e.claimed_at, e.last_error FROM ending e
), letters AS (
    -- The dead letters keep their message, so an operator can queue it again (`session_retry`).
    INSERT INTO dead_letters (session_id, payload, attempts, reason)
    SELECT session_id, payload, attempts, failure_reason FROM dead
    UNION ALL
    SELECT session_id, payload, attempts, 'the start of its conversation failed' FROM behind
    ON CONFLICT (session_id) DO UPDATE
    SET payload = excluded.payload, attempts = excluded.attempts, reason = excluded.reason, failed_at = now()
), failed AS (
    UPDATE dispatch_sessions s
    SET status = 'failed', updated_at = now(), failure_reason = x.failure_reason
    FROM (SELECT session_id, failure_reason, true AS told FROM dead
          UNION ALL
          SELECT session_id, 'the start of its conversation failed', false FROM behind) x
    WHERE s.id = x.session_id AND s.status = 'queued'
    RETURNING s.id, s.org_id, s.agent_session_id, s.issue_id, s.failure_reason, x.told
), notices AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
    SELECT f.org_id, f.id, 'failed', f.agent_session_id, f.issue_id, 'No machine took this: ' || f.failure_reason
    FROM failed f WHERE f.told AND EXISTS (SELECT FROM devpilot_notified(f.org_id))
    RETURNING id
), requeued AS (
    UPDATE dispatch_queue q
    SET lease_expires_at = NULL, claimed_at = NULL, last_error = e.last_error,
        available_at = coalesce(%(now)s::timestamptz, now())
                       + make_interval(secs => devpilot_backoff(e.attempts, %(base)s, %(cap)s))
    FROM ending e
    WHERE q.id = e.id AND e.attempts < %(max_attempts)s
    RETURNING q.id, q.available_at
)

-- name: release
-- CLAIMED -> AVAILABLE (with backoff) or deleted (at the limit), now, as a failed attempt.
-- Compare-and-set: only the live claim of this token ends; any other token changes nothing.
WITH ending AS (
    SELECT id, session_id, attempts, claimed_at, %(reason)s::text AS last_error,
           'released ' || %(max_attempts)s::text || ' times: '
               || coalesce(%(reason)s::text, 'no reason given') AS failure_reason
    FROM dispatch_queue
    WHERE id = %(queue_id)s AND orchestrator_id = %(orchestrator_id)s
      AND claim_token = %(claim_token)s AND lease_expires_at IS NOT NULL
    FOR UPDATE
),
-- include: end_claims
SELECT (SELECT count(*) FROM ending) AS matched,
       (SELECT available_at FROM requeued) AS available_at,
       (SELECT count(*) FROM failed) AS failed,
       (SELECT array_agg(id) FROM notices) AS notice_ids;

-- name: release_peek
-- Before `release`, in its transaction: the agent session of the live claim of this token when the
-- release would dead-letter its agent session's `start` (the attempt limit reached), or no row.
-- Its turn is then taken, waiting, before `release` runs, for the reason `sweep_pick` gives: the
-- messages queued behind the start go with it, and `release`, whose snapshot is taken after the
-- turn, must see every one of them. (Read without a lock: only this token's release or ack, or the
-- sweep, changes the row, and `release` judges it again.)
SELECT q.org_id, q.agent_session_id FROM dispatch_queue q
JOIN dispatch_sessions s ON s.id = q.session_id AND s.kind = 'start'
WHERE q.id = %(queue_id)s AND q.orchestrator_id = %(orchestrator_id)s
  AND q.claim_token = %(claim_token)s AND q.attempts >= %(max_attempts)s
  AND q.agent_session_id IS NOT NULL;

-- name: release_start_peek
-- Before `release_start_lock`: the agent session of a row this machine holds (to take its turn).
SELECT org_id, agent_session_id FROM dispatch_queue
WHERE id = %(queue_id)s AND orchestrator_id = %(orchestrator_id)s;

-- name: release_start_lock
-- CLAIMED, locked: the live claim of this token on a `start` of this machine, or no row (the
-- compare-and-set of `release`; after a wait for the lock, the row's newest version is judged).
SELECT q.id, q.seq FROM dispatch_queue q
WHERE q.id = %(queue_id)s AND q.orchestrator_id = %(orchestrator_id)s
  AND q.claim_token = %(claim_token)s AND q.lease_expires_at IS NOT NULL
  AND EXISTS (SELECT 1 FROM dispatch_sessions s WHERE s.id = q.session_id AND s.kind = 'start')
FOR UPDATE;

-- name: release_start_remove
-- CLAIMED -> deleted, session `cancelled`, after `release_start_lock` in the same transaction: a
-- start given back because its machine does not have the repository it names (`release` with the
-- reason `repository_missing`) is routed again, not retried on that machine. The messages queued
-- behind it (its agent session's, later in order, on this machine: follow-ups sent while it
-- waited; unclaimable while it was undelivered) go with it, as a revoke's move takes them, locked
-- in queue order. Returns each one's message and user, in order, for the routing requests the
-- caller writes in this transaction.
WITH doomed AS (
    SELECT q.id FROM dispatch_queue q
    WHERE q.id = %(queue_id)s
       OR (q.org_id = %(org_id)s AND q.agent_session_id = %(agent_session_id)s
           AND q.seq > %(seq)s AND q.orchestrator_id = %(orchestrator_id)s)
    ORDER BY q.seq
    FOR UPDATE
), removed AS (
    DELETE FROM dispatch_queue dq USING doomed WHERE dq.id = doomed.id
    RETURNING dq.session_id, dq.payload, dq.seq
),
-- include: cancel_removed
SELECT r.payload, s.linear_user_id, (SELECT count(*) FROM cancelled) AS cancelled
FROM removed r JOIN dispatch_sessions s ON s.id = r.session_id
ORDER BY r.seq;

-- name: sweep_pick
-- The first of the sweep's two statements per batch, in one transaction (`sweep` is the second):
-- CLAIMED rows whose lease has expired, locked to the commit. Rows an ack (or release, or another
-- sweep) is touching are skipped (SKIP LOCKED), so a sweep and an ack never both win and two sweeps
-- never count a row twice; so are the rows an earlier batch of this sweep left (`passed`).
-- `turn` says whether the second statement may end the row's claim. A `start` of an agent session at
-- the attempt limit is dead-lettered with the messages queued behind it, so it goes only with its
-- agent session's turn, tried without waiting and held to the commit: a follow-up (or a stop) that
-- is committing keeps its start until the next sweep, and none can commit before this transaction
-- does. The second statement, whose snapshot is taken after these locks, then sees every message
-- queued behind the start: were this one statement, a follow-up committed while it ran would be
-- left queued behind a start that is gone, and reach the machine as a prompt of a conversation it
-- never started. (The turn is tried on the locked rows only, in CASE: it is checked row by row, in
-- that order, after the cheaper conditions.)
WITH expired AS MATERIALIZED (
    SELECT q.id, q.org_id, q.agent_session_id, q.attempts, q.session_id
    FROM dispatch_queue q
    WHERE q.lease_expires_at IS NOT NULL
      AND q.lease_expires_at <= coalesce(%(now)s::timestamptz, now())
      AND NOT q.id = ANY(%(passed)s::uuid[])
    ORDER BY q.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
SELECT e.id,
       CASE WHEN e.attempts < %(max_attempts)s OR e.agent_session_id IS NULL
                 OR NOT EXISTS (SELECT 1 FROM dispatch_sessions s WHERE s.id = e.session_id AND s.kind = 'start')
            THEN true
            ELSE pg_try_advisory_xact_lock(devpilot_agent_session_turn_key(e.org_id, e.agent_session_id))
       END AS turn
FROM expired e;

-- name: sweep
-- CLAIMED with an expired lease -> AVAILABLE (with backoff) or deleted (at the limit): the second
-- statement of a sweep's batch, after `sweep_pick` in its transaction, for the rows it picked with
-- their turn (`ids`). They are this transaction's already, so their state is as the pick saw it;
-- the lease is checked again all the same, in the statement that acts on it.
WITH ending AS (
    SELECT id, session_id, attempts, claimed_at, 'lease expired' AS last_error,
           'no ack after ' || %(max_attempts)s::text || ' delivery attempts' AS failure_reason
    FROM dispatch_queue
    WHERE id = ANY(%(ids)s::uuid[])
      AND lease_expires_at IS NOT NULL
      AND lease_expires_at <= coalesce(%(now)s::timestamptz, now())
    FOR UPDATE
),
-- include: end_claims
SELECT (SELECT count(*) FROM requeued) AS requeued,
       (SELECT count(*) FROM dead) AS dead_lettered,
       (SELECT count(*) FROM failed) AS failed,
       (SELECT count(*) FROM notices) AS notices;

-- name: record_sweep
-- Bookkeeping only: when the sweep ran and what it did (operators' view: `devpilot status` reads
-- the last run). Only the last `kept` runs are kept (SWEEP_RUNS_KEPT in shared/delivery/queue.py, a week of
-- sweeps every 30 s): without that a row would be added every run, for ever, and nothing reads the
-- old ones. One statement, its own transaction; the older runs go by the primary key's range.
WITH ran AS (
    INSERT INTO sweep_runs (requeued, dead_lettered) VALUES (%(requeued)s, %(dead_lettered)s)
    RETURNING id
)
DELETE FROM sweep_runs WHERE id <= (SELECT id FROM ran) - %(kept)s;

-- name: cancel_removed
-- A fragment, included after a `removed` CTE (the session_id of queue rows it deleted): those
-- sessions become `cancelled` with %(reason)s, in the same statement, so the invariant holds at
-- commit. Serves revoke_cancel_rest.
cancelled AS (
    UPDATE dispatch_sessions ds
    SET status = 'cancelled', updated_at = now(), failure_reason = %(reason)s
    FROM removed WHERE ds.id = removed.session_id AND ds.status = 'queued'
    RETURNING ds.id, ds.org_id, ds.agent_session_id, ds.issue_id, ds.kind
)

-- name: stop_for_delivery
-- The last statement of a transaction of stops (`shared.delivery.intake._stop_agent_sessions`),
-- for each of them (`batch`, a JSON array, one element per stop: `n`, `org_id`, `agent_session_id`,
-- `linear_user_id`, `session_id`, `issue_given`, `issue_id`, `issue_identifier`, `payload`,
-- `notice_issue_id`, `body`, `key`), sent after `take_turns`, `routing_cancel_agent_session`,
-- `cancel_agent_session` and `record_stop` (`shared.plumbing.db.together`), so under the agent
-- sessions' turns, with a snapshot taken after the cancel: only for a stop whose delivery
-- `take_turns` recorded (`devpilot.verdict_<n>` 'go'), it tells the machine that has had a
-- message of the agent session delivered (`holder`, `devpilot_agent_session_holder`, as the
-- intake transaction reads it) with a `stop`, or, with no such machine, writes Linear's notice
-- that nothing had started (for an org Linear is told about), and writes what the delivery did
-- (`stopped`). The whole transaction is then one round trip, with nothing decided between its
-- statements. The elements' agent sessions are distinct.
-- The `stop` is `batch_session_rows` with the holder's values: the message names the agent
-- session as its machine knows it (`devpilot:<id>` for one devpilot opened for an assignment), and
-- the holder's issue when the webhook names none (`issue_given`). The holder's machine cannot be
-- revoked meanwhile: the cancel locked the machines of the conversations' queued and delivered
-- messages (FOR KEY SHARE, to the commit), so a revoke either committed before that (and the
-- holder, read after, is another machine or none) or waits for this commit; `target` reads the
-- row FOR KEY SHARE again, as `enqueue`'s, and without it the stop is told as to nobody.
-- One row per element, in the order of `n`: the stop's session (NULL: none), the notice (NULL: none).
WITH want AS (  -- (one JSON array: the client dumps it in C)
    SELECT w.*, current_setting('devpilot.verdict_' || w.n, true) AS verdict
    FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(n int, org_id text, agent_session_id text, linear_user_id text, session_id uuid,
             issue_given boolean, issue_id text, issue_identifier text, payload jsonb,
             notice_issue_id text, body text, key text)
), holder AS (
    SELECT w.n, h.orchestrator_id, h.issue_id, h.issue_identifier, h.opened_for
    FROM want w CROSS JOIN LATERAL devpilot_agent_session_holder(w.org_id, w.agent_session_id, true) h
    WHERE w.verdict = 'go'
), machine AS (
    SELECT h.n, o.id, o.name, o.listening_until > now() AS listening
    FROM holder h JOIN orchestrators o ON o.id = h.orchestrator_id
    WHERE o.revoked_at IS NULL
    FOR KEY SHARE OF o
), target AS (
    SELECT m.n, m.id, m.listening, w.session_id, w.org_id, w.linear_user_id,
           CASE WHEN w.issue_given THEN w.issue_id ELSE coalesce(h.issue_id, '') END AS issue_id,
           CASE WHEN w.issue_given THEN w.issue_identifier ELSE h.issue_identifier END AS issue_identifier,
           w.agent_session_id, 'stop'::text AS kind,
           w.payload
           || jsonb_build_object('agentSessionId', coalesce('devpilot:' || h.opened_for, w.agent_session_id))
           || CASE WHEN w.issue_given THEN '{}'::jsonb
                   ELSE jsonb_build_object('issue', jsonb_build_object(
                            'id', coalesce(h.issue_id, ''), 'identifier', h.issue_identifier,
                            'title', NULL, 'url', NULL, 'description', NULL)) END AS payload
    FROM machine m JOIN holder h ON h.n = m.n JOIN want w ON w.n = m.n
),
-- include: batch_session_rows
, told AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
    SELECT w.org_id, NULL, 'stopped', w.agent_session_id, w.notice_issue_id, w.body
    FROM want w
    WHERE w.verdict = 'go' AND NOT EXISTS (SELECT FROM target t WHERE t.n = w.n)
      AND EXISTS (SELECT FROM devpilot_notified(w.org_id))
    RETURNING id, agent_session_id
), finished AS (
    UPDATE webhook_deliveries d
    SET outcome = 'stopped'
    FROM want w
    WHERE d.delivery_key = w.key AND w.verdict = 'go'
)
SELECT w.n, q.session_id, told.id AS notice_id,
       (SELECT count(pg_notify('devpilot_dispatch', l.id::text))
        FROM (SELECT DISTINCT t.id FROM target t JOIN q ON q.session_id = t.session_id WHERE t.listening) l)
           AS notified
FROM want w
LEFT JOIN q ON q.session_id = w.session_id
LEFT JOIN told ON told.agent_session_id = w.agent_session_id
ORDER BY w.n;

-- name: cancel_agent_session
-- AVAILABLE or CLAIMED -> deleted, session `cancelled`, in the caller's transaction: every
-- undelivered message of each agent session of `batch` (a JSON array, one element per stop: `n`,
-- `org_id`, `agent_session_id`; Linear's stop). Same lock order as
-- issue_changes_for_delivery, so an ack racing it either wins (delivered: the caller then
-- queues a `stop`) or gets 404.
-- Two lock orders keep a stop out of deadlocks, each with a party that holds one lock and then
-- wants the stop's:
-- * `machines` first: the machines of the conversations (of their queued and delivered messages)
--   FOR KEY SHARE, in id order, the lock the stop's own enqueue takes next, before any queue row.
--   A revoke holds its machine's row, then cancels that machine's rows; a stop holding one of
--   those while it waited for the machine would deadlock with it.
-- * then the rows in queue order (seq, so each agent session's in its order), not in the order a
--   scan meets them: the sweep or a release that dead-letters a start holds the start's row, then
--   deletes the rows behind it (`end_claims`); a stop holding a later row while it waited for the
--   start's would deadlock.
-- Rows gone by then (the sweep or the revoke took them) are skipped.
-- In a transaction of stops (`shared.delivery.intake._stop_agent_sessions`), sent after
-- `take_turns`: it cancels an element's only when that statement recorded its delivery
-- (`devpilot.verdict_<n>` 'go'; `n` NULL: an element used alone, always). One row per session
-- cancelled (`n`, `id`).
WITH want AS (
    SELECT w.* FROM jsonb_to_recordset(%(batch)s::jsonb) AS w(n int, org_id text, agent_session_id text)
    WHERE w.n IS NULL OR current_setting('devpilot.verdict_' || w.n, true) = 'go'
), machines AS (
    SELECT o.id FROM orchestrators o
    WHERE o.id IN (SELECT s.orchestrator_id FROM want w
                   JOIN dispatch_sessions s ON s.org_id = w.org_id AND s.agent_session_id = w.agent_session_id
                   WHERE s.status IN ('queued', 'delivered'))
    ORDER BY o.id
    FOR KEY SHARE
), doomed AS (
    SELECT dq.id, w.n FROM want w
    JOIN dispatch_queue dq ON dq.org_id = w.org_id AND dq.agent_session_id = w.agent_session_id
    WHERE (SELECT count(*) FROM machines) >= 0  -- (true: it makes the machines come first)
    ORDER BY dq.seq
    FOR UPDATE OF dq
), removed AS (
    DELETE FROM dispatch_queue dq USING doomed WHERE dq.id = doomed.id
    RETURNING dq.session_id, doomed.n
), cancelled AS (  -- (as `cancel_removed`, each with its element's `n`)
    UPDATE dispatch_sessions ds
    SET status = 'cancelled', updated_at = now(), failure_reason = %(reason)s
    FROM removed WHERE ds.id = removed.session_id AND ds.status = 'queued'
    RETURNING ds.id, removed.n
)
SELECT n, id FROM cancelled;

-- name: moving
-- A fragment, the body of a `moving` CTE after a `rows` CTE of starts that are moving (id, org_id,
-- agent_session_id, seq, source, target): those starts, and the unclaimed messages queued behind
-- each one — its agent session's, later in order, on the machine it leaves — which go where it goes.
SELECT id, source, target FROM rows
UNION
SELECT f.id, f.orchestrator_id, r.target
FROM rows r
JOIN dispatch_queue f ON f.org_id = r.org_id AND f.agent_session_id = r.agent_session_id
    AND f.seq > r.seq AND f.orchestrator_id = r.source AND f.lease_expires_at IS NULL

-- name: reroute_quiet_pick
-- AVAILABLE -> AVAILABLE on another machine (the sweep), the first of two statements in one
-- transaction (`reroute_quiet_move` is the second): unclaimed `start` messages of a machine not
-- seen for `after` seconds (a laptop closed on a train), each with the machine it goes to: the
-- same user's most recently seen active machine that was seen within that time. Never a claimed
-- row (a lease is held), never a prompt or a stop of a conversation a machine already has. Rows a
-- claim is taking are skipped (SKIP LOCKED), and a claim that comes later finds the row no longer
-- its own: exactly one of them gets it. A start that names a repository moves only to a machine
-- that has it.
-- An agent session's start moves only with its agent session's turn, tried without waiting and
-- held to the commit (`devpilot_agent_session_turn_key`): a follow-up or a stop of it that is
-- committing keeps its start where it is until the next sweep, and none can commit before this
-- transaction does. So the second statement, whose snapshot is taken after these locks, sees every
-- message queued behind each start, and moves them all with it: were this one statement, a
-- follow-up committed while it ran would stay on the quiet machine, behind a start gone elsewhere.
-- The quiet machines that have somewhere to go are found first (MATERIALIZED): planned as one join,
-- every queued start of a quiet machine read its session before the target was looked for (1.1 s
-- for 9,430 starts of machines whose users have no other, beside 10,000,000 sessions).
WITH quiet AS MATERIALIZED (
    SELECT o.id, t.id AS target
    FROM orchestrators o
    CROSS JOIN LATERAL (
        SELECT o2.id FROM orchestrators o2
        WHERE o2.org_id = o.org_id AND o2.linear_user_id = o.linear_user_id AND o2.id <> o.id
          AND o2.revoked_at IS NULL AND o2.last_seen_at >= now() - make_interval(secs => %(after)s)
        ORDER BY o2.last_seen_at DESC, o2.id
        LIMIT 1
    ) t
    WHERE o.revoked_at IS NULL AND coalesce(o.last_seen_at, o.created_at) < now() - make_interval(secs => %(after)s)
), starts AS MATERIALIZED (  -- (chosen and locked first: only these try a turn, below)
    SELECT q.id, q.org_id, q.agent_session_id, q.seq, q.orchestrator_id AS source, quiet.target
    FROM quiet
    JOIN dispatch_queue q ON q.orchestrator_id = quiet.id AND q.lease_expires_at IS NULL
    -- (each candidate's session read by its key: joined, both plans could hash every start session
    -- the table holds, with `orchestrators` analyzed and an empty `machine_inventories` not)
    WHERE (SELECT s.kind FROM dispatch_sessions s WHERE s.id = q.session_id) = 'start'
      -- a start routed by repository moves only to a machine that has it (else it waits for its own)
      AND (q.payload->'repository'->>'fullName' IS NULL OR EXISTS (
        SELECT 1 FROM machine_inventories i
        WHERE i.orchestrator_id = quiet.target
          AND i.repository_keys @> ARRAY[lower(q.payload->'repository'->>'hostname') || '/'
                                        || lower(q.payload->'repository'->>'fullName')]))
    LIMIT %(batch)s
    FOR UPDATE OF q SKIP LOCKED
)
-- The turns are tried on the chosen starts only: a condition on the scan of dispatch_queue would be
-- checked on every row the scan reads (a quiet machine's follow-ups, other machines' work), each
-- taking a lock held to the commit, enough of them to fill the server's lock table.
SELECT * FROM starts
WHERE agent_session_id IS NULL
   OR pg_try_advisory_xact_lock(devpilot_agent_session_turn_key(org_id, agent_session_id));

-- name: reroute_quiet_move
-- The second statement of the reroute (after `reroute_quiet_pick`, in its transaction; `picked`,
-- a JSON array of its rows): each picked start, and the unclaimed messages queued behind it — its
-- agent session's, later in order, on the machine it leaves — move to its new machine. No machine
-- has that conversation yet, and they cannot have been claimed while the start was undelivered,
-- so the machine that gets the start gets them, in order, and the quiet one never hears of a
-- conversation it was never given. The sessions follow, and each machine that got work is woken.
WITH rows AS (
    SELECT * FROM jsonb_to_recordset(%(picked)s::jsonb)
        AS r(id uuid, org_id text, agent_session_id text, seq bigint, source uuid, target uuid)
), moving AS (
-- include: moving
), going AS (
    SELECT id, source, target FROM moving
),
-- include: move_unclaimed
SELECT count(*) AS rerouted,
       (SELECT count(pg_notify('devpilot_dispatch', d.orchestrator_id::text))
        FROM (SELECT DISTINCT orchestrator_id FROM sessions) d) AS woken
FROM sessions;

-- name: issue_changes_for_delivery
-- (none) -> AVAILABLE, and AVAILABLE or CLAIMED -> deleted, session `cancelled`: the whole intake
-- of issues' assignment events (created with an assignee, assigned, re-assigned, unassigned,
-- removed) for one or several webhooks (`batch`, a JSON array, one element per webhook, numbered
-- `n`; `route_user` NULL: a cancel alone), in one statement that is its own transaction
-- (`shared.plumbing.db.statement`): the whole batch commits together or not at all, after one
-- round trip and one commit. The caller answers no webhook before the commit. The elements'
-- issues are distinct, and so are their keys (a turn is re-entrant within one transaction, and a
-- key twice would match one inserted record twice).
--
-- * `turns`: every element's issue turn (`devpilot_issue_turn_key`), taken waiting, before
--   anything is read or written, in the order of the turns' keys (two batches never wait for each
--   other in a circle, and no turn is waited for while a row lock is held). Held to the commit:
--   the next assignment event of the issue waits for this one and then finds its dispatch to
--   cancel.
-- * `judged`, read with snapshots taken after the turns (VOLATILE functions, migrations 0015 and
--   0025): `superseded`, a later assignment change of the issue was handled already (`event_at`,
--   recorded with the delivery): recorded `ignored`, nothing else written; `undelivered`, the
--   issue's undelivered assignment dispatches (never an agent session's message).
-- * `open`: their queue rows as this statement's snapshot, older than the turn, sees them. One it
--   cannot see (committed by the turn's previous holder while this waited: `overtaken`): nothing is
--   written for the element, not its delivery either, and the caller writes it again, in a new
--   statement whose snapshot sees it.
-- * the routing choice for `route_user` (`route`), then the locks, machines first (as
--   `cancel_agent_session` takes them): every machine the element goes on to queue for or delete
--   rows of, FOR KEY SHARE, in id order, to the commit; then the rows to cancel FOR UPDATE, in
--   queue order (seq), as ack, sweep and release lock theirs. A revoke holds its machine's row,
--   then its rows in queue order, so either it waits for this commit or this waits for it holding
--   none of its rows; a racing ack either wins (its row is skipped: delivered, not cancelled) or
--   finds the row gone (404). The machine chosen revoked meanwhile (its lock reads it revoked):
--   nothing is written for the element (`revoked`), and the caller writes it again.
-- * the delivery (two keys, as `record_delivery`) ON CONFLICT DO NOTHING, recorded with what it
--   did: `dispatched` to the new session; `routing`, the user's machines differing in what they
--   have (`mixed`), with the start's routing request (the repository is asked of Linear after the
--   commit); `cancelled`, with the first session cancelled; else `ignored` (no machine: Linear is
--   not told about a plain issue). Only a delivery recorded here cancels and queues.
-- One row per element, in order: `outcome` NULL means nothing was written for it (a delivery seen
-- before, `revoked`, `overtaken`).
-- (`el`: each element whole, so that no statement after it joins more than three relations: the
-- planner's search of join orders was most of its planning time.)
WITH want AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(n int, org_id text, route_user text, delivery_key text, content_key text, session_id uuid,
             issue_id text, issue_identifier text, event_at timestamptz, payload jsonb, reason text)
), turns AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(k.key) FROM (
        SELECT DISTINCT devpilot_issue_turn_key(w.org_id, w.issue_id) AS key FROM want w ORDER BY 1 OFFSET 0
    ) k
), judged AS MATERIALIZED (
    SELECT want.*,
           want.event_at IS NOT NULL
           AND devpilot_issue_event_superseded(want.org_id, want.issue_id, want.event_at) AS superseded,
           devpilot_issue_undelivered(want.org_id, want.issue_id) AS undelivered
    FROM want WHERE (SELECT count(*) FROM turns) >= 0
), open AS MATERIALIZED (
    SELECT j.n, dq.id, dq.orchestrator_id FROM judged j JOIN dispatch_queue dq ON dq.session_id = ANY (j.undelivered)
    WHERE NOT j.superseded
), looked AS MATERIALIZED (
    SELECT j.*, NOT j.superseded AND cardinality(j.undelivered) > (SELECT count(*) FROM open o WHERE o.n = j.n)
                AS overtaken
    FROM judged j
), routed AS (
    SELECT want.n, r.id, coalesce(r.mixed, false) AS mixed
    FROM looked want LEFT JOIN LATERAL (
-- include: route
    ) r ON true
    WHERE want.route_user IS NOT NULL AND NOT want.superseded AND NOT want.overtaken
), machines AS MATERIALIZED (
    SELECT o.id, o.revoked_at IS NULL AS active, o.listening_until > now() AS listening
    FROM orchestrators o
    WHERE o.id = ANY (ARRAY(SELECT r.id FROM routed r WHERE NOT r.mixed
                            UNION SELECT p.orchestrator_id FROM open p JOIN looked l USING (n) WHERE NOT l.overtaken))
    ORDER BY o.id
    FOR KEY SHARE
), doomed AS MATERIALIZED (
    SELECT dq.id, dq.session_id, l.n, l.delivery_key, l.reason
    FROM open p JOIN looked l USING (n) JOIN dispatch_queue dq ON dq.id = p.id
    WHERE NOT l.overtaken AND (SELECT count(*) FROM machines) >= 0  -- (machines first)
    ORDER BY dq.seq
    FOR UPDATE OF dq
), el AS (
    SELECT l.*, NULL::text AS agent_session_id, r.n IS NOT NULL AS routing, r.id AS routed_id,
           coalesce(r.mixed, false) AS mixed, m.id AS machine, m.listening,
           (SELECT min(x.session_id::text)::uuid FROM doomed x WHERE x.n = l.n) AS cancelled
    FROM looked l LEFT JOIN routed r USING (n) LEFT JOIN machines m ON m.id = r.id AND NOT r.mixed AND m.active
), d AS (
    INSERT INTO webhook_deliveries (delivery_key, content_key, session_id, outcome, org_id, issue_id, event_at)
    SELECT delivery_key, content_key,
           CASE WHEN machine IS NOT NULL THEN session_id WHEN NOT mixed AND NOT superseded THEN cancelled END,
           CASE WHEN superseded THEN 'ignored' WHEN machine IS NOT NULL THEN 'dispatched'
                WHEN mixed THEN 'routing' WHEN cancelled IS NOT NULL THEN 'cancelled' ELSE 'ignored' END,
           org_id, issue_id, event_at
    FROM el
    WHERE NOT overtaken AND (superseded OR machine IS NOT NULL OR NOT routing OR routed_id IS NULL OR mixed)
    ON CONFLICT DO NOTHING
    RETURNING delivery_key, outcome
), removed AS (
    DELETE FROM dispatch_queue dq USING doomed x JOIN d USING (delivery_key) WHERE dq.id = x.id
    RETURNING dq.session_id, x.reason
), cancelled AS (  -- (as `cancel_removed`, each with its own element's reason; queued, as its row was;
                 -- by their keys at once: a join to `removed` planned generically read the table whole)
    UPDATE dispatch_sessions ds
    SET status = 'cancelled', updated_at = now(),
        failure_reason = (SELECT x.reason FROM removed x WHERE x.session_id = ds.id)
    WHERE ds.id = ANY (ARRAY(SELECT x.session_id FROM removed x))
),
-- include: start_rows
SELECT n, d.outcome, q.session_id, q.id AS queue_id, q.message_id, q.orchestrator_id,
       NULL::uuid AS notice_id, (SELECT a.id FROM asked a WHERE a.delivery_key = e.delivery_key) AS route_id,
       superseded, overtaken, CASE WHEN d.outcome IS NOT NULL THEN e.cancelled END AS cancelled,
       routed_id IS NOT NULL AND NOT mixed AND machine IS NULL AS revoked,
       (SELECT count(pg_notify('devpilot_dispatch', l.id::text))
        FROM (SELECT DISTINCT t.id FROM target t WHERE t.listening) l) AS notified
FROM el e LEFT JOIN d USING (delivery_key) LEFT JOIN q ON q.session_id = e.session_id AND d.outcome = 'dispatched'
ORDER BY n;

-- name: route_and_start_agent_sessions_many_for_delivery
-- (none) -> AVAILABLE: the whole intake of agent sessions `created` by a person, for one or several
-- webhooks (`batch`, a JSON array, one element per webhook, numbered `n`), in one statement that
-- is its own transaction (`shared.plumbing.db.statement`): the whole batch commits together or not
-- at all, after one round trip and one commit. The caller answers no webhook before the commit.
-- The elements' keys and agent sessions are distinct (the caller writes a second element of an
-- agent session after the first: a turn is re-entrant within one transaction, and a key twice
-- would match one inserted record twice).
-- * `turns`: every element's agent session turn (`agent_session_turn`), taken waiting, before
--   anything is read or written, in the order of the turns' keys, as `take_turns` takes a batch's.
--   Held to the commit, so a `prompted` or a stop of the same agent session that comes meanwhile
--   waits for this start and then finds it.
-- * `judged`, read with a snapshot taken after the turns: whether the agent session may start
--   (`devpilot_agent_session_seen`, migration 0014): one already started (a message queued, or a
--   start waiting to be routed), or stopped, is recorded `ignored`, and nothing else is written.
-- * for the rest, as an issue's start: the routing choice (`route`), the machine's lock FOR KEY
--   SHARE (a revoke committed meanwhile: nothing is written for it, and it answers `revoked`: the
--   caller writes it again), the delivery (two keys) ON CONFLICT DO NOTHING, recorded as
--   dispatched to the new session, with its session and queue row and, for an org Linear is told
--   about, the "Queued for <machine>" thought; a user with no machine: recorded `ignored`, and
--   Linear told why (`unroutable`, the body of an `error`: the agent session waits on us); a user
--   whose machines differ: recorded `routing`, with the start's routing request (which of them
--   has the repository is asked of Linear after the commit).
-- One row per element, in order: `outcome` NULL means nothing was written for it (a delivery seen
-- before, or `revoked`). (`el`: each element whole, so that no statement after it joins more than
-- three relations: the planner's search of join orders was most of its planning time.)
WITH want AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(n int, org_id text, route_user text, delivery_key text, content_key text, session_id uuid,
             issue_id text, issue_identifier text, agent_session_id text, payload jsonb)
), turns AS (
    SELECT pg_advisory_xact_lock(k) FROM (
        SELECT DISTINCT devpilot_agent_session_turn_key(org_id, agent_session_id) AS k FROM want ORDER BY 1
    ) x
), judged AS (
    SELECT want.*, devpilot_agent_session_seen(org_id, agent_session_id, true) AS seen
    FROM want WHERE (SELECT count(*) FROM turns) >= 0
), routed AS (
    SELECT want.n, r.id, r.mixed
    FROM judged want LEFT JOIN LATERAL (
-- include: route
    ) r ON true
    WHERE want.seen IS NULL
), machine AS (
    SELECT r.n, o.id, o.name, o.listening_until > now() AS listening
    FROM routed r JOIN orchestrators o ON o.id = r.id
    WHERE o.revoked_at IS NULL AND NOT r.mixed
    FOR KEY SHARE OF o
), el AS (
    SELECT j.*, r.n IS NOT NULL AS routing, r.id AS routed_id, r.mixed, m.id AS machine, m.name, m.listening
    FROM judged j LEFT JOIN routed r USING (n) LEFT JOIN machine m USING (n)
), d AS (
    INSERT INTO webhook_deliveries (delivery_key, content_key, session_id, outcome)
    SELECT delivery_key, content_key, CASE WHEN machine IS NOT NULL THEN session_id END,
           CASE WHEN machine IS NOT NULL THEN 'dispatched' WHEN mixed THEN 'routing' ELSE 'ignored' END
    FROM el
    WHERE machine IS NOT NULL OR routed_id IS NULL OR mixed
    ON CONFLICT DO NOTHING
    RETURNING delivery_key, outcome
),
-- include: start_rows
,
-- include: agent_session_notices

SELECT n, d.outcome, q.session_id, q.id AS queue_id, q.message_id, q.orchestrator_id,
       (SELECT t.id FROM told t WHERE t.agent_session_id = e.agent_session_id) AS notice_id,
       (SELECT a.id FROM asked a WHERE a.delivery_key = e.delivery_key) AS route_id, seen,
       NOT mixed AND machine IS NULL AS revoked,
       (SELECT count(pg_notify('devpilot_dispatch', t.id::text)) FROM target t WHERE t.listening)
FROM el e LEFT JOIN d USING (delivery_key) LEFT JOIN q USING (session_id)
ORDER BY n;

-- name: follow_ups_for_delivery
-- (none) -> AVAILABLE: the whole intake of follow-ups (`prompted`, the `select` signal's answers
-- among them) for one or several webhooks (`batch`, a JSON array, one element per webhook, numbered
-- `n`), in one statement that is its own transaction (`shared.plumbing.db.statement`): the whole
-- batch commits together or not at all, after one round trip and one commit. The elements' keys
-- and agent sessions are distinct (the caller writes a second element of an agent session after
-- the first: a turn is re-entrant within one transaction).
-- * `turns`: every element's agent session turn, taken waiting, before anything is read or
--   written, in the order of the turns' keys, as `take_turns` takes a batch's. Held to the commit:
--   the queue row's `seq` is taken under it, so the message is ordered after every earlier one of
--   its agent session, and a stop that comes meanwhile finds it.
-- * `judged`, read with snapshots taken after the turns (VOLATILE functions, migrations 0013,
--   0016 and 0024; the statement's own snapshot is older than the turns): whether the agent
--   session was stopped at or after the follow-up was written (`prompt_at`), its holder (the
--   machine its latest message went to, the issue, and the name devpilot opened it under, if it
--   did), and its open routing request (and whether that asked the person which repository).
-- * `way`, each element's decision, in this order: `stopped`, recorded `ignored`, nothing else
--   written; `holder`, a `prompt` for the holder (with the name the machine knows the agent
--   session by, and the holder's issue when the webhook names none); `answer`, a `select` that
--   answers the question its open request asked: the person's pick completes that request, due
--   again at once (a request can only have been asked, hence visible here, before its answer was
--   written); `none`, no issue: Linear told nothing can take it; `later`, a start still waiting to
--   be routed (the follow-up waits behind it), or no writer to route by (Linear names the
--   assignee): a routing request of its own; `start`, the conversation started on the writer's
--   machine (`route`), as an agent session's `created` is, with the "Queued for" thought; the
--   writer's machines differing: a routing request (which has the repository); no machine: Linear
--   told why (`unroutable`).
-- The machine (the holder, or the one chosen) is locked FOR KEY SHARE: a revoke committed meanwhile
-- is seen, nothing is written for the element, and it answers `revoked` (the caller writes it
-- again). The delivery (two keys) is inserted ON CONFLICT DO NOTHING: a delivery seen before
-- writes nothing. One row per element, in order: `outcome` NULL means nothing was written for it.
-- (`el`: each element whole, so that no statement after it joins more than three relations: the
-- planner's search of join orders was most of its planning time.)
WITH want AS (
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(n int, org_id text, route_user text, delivery_key text, content_key text, session_id uuid,
             issue_id text, issue_identifier text, agent_session_id text, payload jsonb, start jsonb,
             prompt_at timestamptz, picked text)
), turns AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(k.key) FROM (
        SELECT DISTINCT devpilot_agent_session_turn_key(w.org_id, w.agent_session_id) AS key
        FROM want w ORDER BY 1 OFFSET 0
    ) k
), judged AS MATERIALIZED (
    SELECT w.*, h.orchestrator_id AS holder, h.opened_for, h.issue_id AS h_issue, h.issue_identifier AS h_ident,
           w.prompt_at IS NOT NULL
           AND devpilot_agent_session_stopped_since(w.org_id, w.agent_session_id, w.prompt_at) AS stopped,
           rq.id AS request, rq.asked
    FROM want w
    LEFT JOIN LATERAL devpilot_agent_session_holder(w.org_id, w.agent_session_id, false) h ON true
    LEFT JOIN LATERAL (  -- (only for one nobody holds: a one-time filter, no call for the rest)
        SELECT * FROM devpilot_agent_session_request(w.org_id, w.agent_session_id)
        WHERE h.orchestrator_id IS NULL OFFSET 0
    ) rq ON true
    WHERE (SELECT count(*) FROM turns) >= 0
), decided AS (
    SELECT j.*, CASE WHEN j.stopped THEN 'stopped' WHEN j.holder IS NOT NULL THEN 'holder'
                     WHEN j.picked IS NOT NULL AND j.asked THEN 'answer' WHEN j.issue_id IS NULL THEN 'none'
                     WHEN j.request IS NOT NULL OR j.route_user IS NULL THEN 'later' ELSE 'start' END AS way
    FROM judged j
), routed AS (
    SELECT want.n, r.id, coalesce(r.mixed, false) AS mixed
    FROM decided want LEFT JOIN LATERAL (
-- include: route
    ) r ON true
    WHERE want.way = 'start'
), machine AS (  -- (each machine's row by its key: a join was planned as a scan of every machine)
    SELECT x.n, x.kind, m.* FROM (
        SELECT n, holder AS id, 'prompt' AS kind FROM decided WHERE way = 'holder'
        UNION ALL SELECT n, id, 'start' FROM routed WHERE NOT mixed
    ) x CROSS JOIN LATERAL (
        SELECT o.id, o.name, o.listening_until > now() AS listening FROM orchestrators o
        WHERE o.id = x.id AND o.revoked_at IS NULL
        FOR KEY SHARE
    ) m
), el AS (
    SELECT e.*, e.way IN ('start', 'none') AS routing, r.id AS routed_id, r.mixed, m.id AS machine, m.kind,
           m.name, m.listening, CASE WHEN m.id IS NOT NULL THEN 'dispatched'
                WHEN e.way IN ('answer', 'later') OR r.mixed THEN 'routing'
                WHEN e.way IN ('stopped', 'none') OR r.id IS NULL AND e.way = 'start' THEN 'ignored' END AS outcome
    FROM decided e LEFT JOIN routed r USING (n) LEFT JOIN machine m USING (n)
), d AS (
    INSERT INTO webhook_deliveries (delivery_key, content_key, session_id, outcome)
    SELECT e.delivery_key, e.content_key, CASE WHEN e.machine IS NOT NULL THEN e.session_id END, e.outcome
    FROM el e WHERE e.outcome IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING delivery_key, outcome
), asked AS (
    INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message, delivery_key,
                                  linear_user_id)
    SELECT e.org_id, e.agent_session_id, e.issue_id,
           CASE WHEN e.route_user IS NULL THEN 'assignee' ELSE 'repository' END, e.payload, e.delivery_key,
           e.route_user
    FROM el e JOIN d USING (delivery_key)
    WHERE d.outcome = 'routing' AND e.way <> 'answer'
    RETURNING id, delivery_key
), answered AS (
    UPDATE routing_requests r SET choice = e.picked, available_at = now()
    FROM el e JOIN d USING (delivery_key)
    WHERE e.way = 'answer' AND r.id = e.request AND r.done_at IS NULL AND r.asked_at IS NOT NULL
), target AS (
    SELECT e.n, e.machine AS id, e.listening, e.session_id, e.org_id, e.route_user AS linear_user_id,
           coalesce(e.issue_id, e.h_issue, '') AS issue_id,
           CASE WHEN e.issue_id IS NULL THEN e.h_ident ELSE e.issue_identifier END AS issue_identifier,
           e.agent_session_id, e.kind,
           CASE WHEN e.kind = 'start' THEN e.start
                WHEN e.opened_for IS NULL AND e.issue_id IS NOT NULL THEN e.payload
                ELSE e.payload || jsonb_build_object(
                    'agentSessionId', coalesce('devpilot:' || e.opened_for, e.agent_session_id),
                    'issue', e.payload->'issue' || jsonb_build_object(
                        'id', coalesce(e.issue_id, e.h_issue, ''),
                        'identifier', CASE WHEN e.issue_id IS NULL THEN e.h_ident ELSE e.issue_identifier END))
           END AS payload
    FROM el e JOIN d USING (delivery_key)
    WHERE e.machine IS NOT NULL
),
-- include: batch_session_rows
,
-- include: agent_session_notices

SELECT e.n, d.outcome, e.way, e.kind, q.session_id, q.id AS queue_id, q.message_id, q.orchestrator_id,
       (SELECT t.id FROM told t WHERE t.agent_session_id = e.agent_session_id) AS notice_id,
       coalesce((SELECT a.id FROM asked a WHERE a.delivery_key = e.delivery_key),
                CASE WHEN e.way = 'answer' THEN e.request END) AS route_id,
       e.way IN ('holder', 'start') AND e.machine IS NULL AND (e.way = 'holder' OR e.routed_id IS NOT NULL AND NOT e.mixed)
       AS revoked,
       (SELECT count(pg_notify('devpilot_dispatch', l.id::text))
        FROM (SELECT DISTINCT t.id FROM target t WHERE t.listening) l) AS notified
FROM el e LEFT JOIN d USING (delivery_key) LEFT JOIN q USING (session_id)
ORDER BY e.n;

-- name: agent_session_notices
-- A fragment, the notices of the agent sessions' batch statements
-- (`route_and_start_agent_sessions_many_for_delivery`, `follow_ups_for_delivery`), after `el` (each
-- element: `routing`, routed as a start; `routed_id`, the machine routing chose, NULL for none;
-- `name`, the machine's), `d` and `q`: `told`, for an org Linear is told about, Linear's "Queued
-- for <machine>" thought for a start queued, and its `error` (`unroutable`) for one no machine can
-- take. Each commits with its element's rows or not at all, and is posted after the commit.
told AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body, content)
    SELECT e.org_id, q.session_id, x.k, e.agent_session_id, e.issue_id, x.b,
           CASE WHEN q.id IS NOT NULL THEN jsonb_build_object('type', 'thought', 'body', x.b) END
    FROM el e JOIN d USING (delivery_key) LEFT JOIN q USING (session_id), LATERAL (
        SELECT CASE WHEN q.id IS NULL THEN 'failed' ELSE 'dispatched' END AS k,
               coalesce('Queued for ' || e.name, %(unroutable)s) AS b
    ) x
    WHERE e.routing AND (q.id IS NOT NULL OR e.routed_id IS NULL) AND EXISTS (SELECT FROM devpilot_notified(e.org_id))
    RETURNING id, agent_session_id
)

-- name: start_rows
-- A fragment of the starts' statements (an issue's assignment, an agent session's `created`), after
-- a CTE `el` (one row per element: `n`, `org_id`, `route_user`, `delivery_key`, `session_id`,
-- `issue_id`, `issue_identifier`, `agent_session_id` (NULL for an issue's), `payload`, its
-- `machine` and whether that machine is `listening`) and `d` (the deliveries this statement
-- recorded, with their `outcome`): `asked`, the routing request of each start recorded `routing`
-- (the user's machines differ: which has the repository is asked of Linear after the commit);
-- `target`, each start recorded `dispatched`; and their sessions and queue rows
-- (`batch_session_rows`).
asked AS (
    INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message, delivery_key,
                                  linear_user_id)
    SELECT org_id, agent_session_id, issue_id, 'repository', payload, delivery_key, route_user
    FROM el JOIN d USING (delivery_key) WHERE outcome = 'routing'
    RETURNING id, delivery_key
), target AS (
    SELECT n, machine AS id, listening, session_id, org_id, route_user AS linear_user_id, issue_id,
           issue_identifier, agent_session_id, 'start' AS kind, payload
    FROM el JOIN d USING (delivery_key) WHERE outcome = 'dispatched'
),
-- include: batch_session_rows

-- name: batch_session_rows
-- A fragment of the batch statements, after a CTE `target` (one row per element to write: its
-- machine `id`, `session_id`, `org_id`, `linear_user_id`, `issue_id`, `issue_identifier`,
-- `agent_session_id`, `kind`, `payload`): `s`, the sessions, and `q`, their queue rows, as
-- `enqueue_session_rows` writes one (the session written once, with its queue row's ids chosen).
s AS (
    INSERT INTO dispatch_sessions (id, org_id, orchestrator_id, status, linear_user_id, issue_id,
                                   issue_identifier, agent_session_id, kind, queue_id, message_id)
    SELECT t.session_id, t.org_id, t.id, 'queued', t.linear_user_id, t.issue_id, t.issue_identifier,
           t.agent_session_id, t.kind, gen_random_uuid(), gen_random_uuid()
    FROM target t
    RETURNING id, queue_id, message_id, orchestrator_id, org_id
), q AS (
    INSERT INTO dispatch_queue (id, message_id, session_id, orchestrator_id, org_id, payload,
                                agent_session_id, available_at)
    SELECT s.queue_id, s.message_id, s.id, s.orchestrator_id, s.org_id, t.payload, t.agent_session_id,
           coalesce(%(now)s::timestamptz, now())
    FROM s JOIN target t ON t.session_id = s.id
    RETURNING id, message_id, session_id, orchestrator_id
)

-- ---------------------------------------------------------------------------------------------
-- Operators' and the revoke's writes of the queue: run by `shared.delivery.queue` in the transaction of the
-- action (`shared.operators.sessions`: its locks and its record in `session_actions`) or of the revoke
-- (`orchestrators.mark_revoked` first). Each statement's owner is the queue: the sessions and the
-- outbox rows written with a queue row are written by the same statement, so they commit together.

-- name: session_requeue
-- Owner: the queue (with the session it points at and Linear's notice, in one statement).
-- failed -> queued (an operator's retry): the dead letter's message gets a new queue row, the
-- same message id, attempts from 0, due now, for `orchestrator_id` if it is still active (its row
-- FOR KEY SHARE, as `enqueue` locks it: a revoke committed meanwhile writes nothing here), and
-- the session points at it, in one statement. With it, for an org Linear is told about, the
-- agent session hears "Retrying on <machine>". No row: nothing was written.
WITH target AS (
    SELECT id, name, listening_until > now() AS listening
    FROM orchestrators WHERE id = %(orchestrator_id)s AND revoked_at IS NULL
    FOR KEY SHARE
), letter AS (
    SELECT payload FROM dead_letters WHERE session_id = %(id)s
), s AS (
    UPDATE dispatch_sessions ds
    SET status = 'queued', orchestrator_id = t.id, queue_id = gen_random_uuid(), failure_reason = NULL,
        acked_claim_token = NULL, delivered_at = NULL, claimed_at = NULL, updated_at = now()
    FROM target t
    WHERE ds.id = %(id)s AND ds.status = 'failed' AND EXISTS (SELECT 1 FROM letter)
    RETURNING ds.id, ds.queue_id, ds.message_id, ds.orchestrator_id, ds.org_id, ds.agent_session_id, ds.issue_id
), q AS (
    INSERT INTO dispatch_queue (id, message_id, session_id, orchestrator_id, org_id, payload, agent_session_id)
    SELECT s.queue_id, s.message_id, s.id, s.orchestrator_id, s.org_id, (SELECT payload FROM letter),
           s.agent_session_id
    FROM s
    RETURNING id, session_id, orchestrator_id
), told AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body, content)
    SELECT s.org_id, s.id, 'dispatched', s.agent_session_id, s.issue_id, 'Retrying on ' || t.name,
           jsonb_build_object('type', 'thought', 'body', 'Retrying on ' || t.name)
    FROM s JOIN target t ON t.id = s.orchestrator_id
    WHERE s.agent_session_id IS NOT NULL AND EXISTS (SELECT FROM devpilot_notified(s.org_id))
    RETURNING id
)
SELECT q.id AS queue_id, t.name AS machine, (SELECT array_agg(id) FROM told) AS notice_ids,
       (SELECT count(pg_notify('devpilot_dispatch', t2.id::text)) FROM target t2 WHERE t2.listening) AS notified
FROM q JOIN target t ON t.id = q.orchestrator_id;

-- name: session_cancel
-- Owner: the queue (with the sessions cancelled and Linear's notice, in one statement).
-- queued -> cancelled (an operator's cancel): its queue row (claimed or not: a late ack then gets
-- 404) and, for a start, the messages of its agent session queued behind it on its machine (no
-- machine has that conversation), locked in queue order as a stop locks them, deleted, their
-- sessions cancelled, in one statement (`cancel_doomed`). An agent session whose start is
-- cancelled hears it as for a stop (a final response), for an org Linear is told about.
WITH mine AS (
    SELECT q.id, q.org_id, q.agent_session_id, q.seq, q.orchestrator_id, s.kind
    FROM dispatch_queue q JOIN dispatch_sessions s ON s.id = q.session_id
    WHERE q.session_id = %(id)s
), doomed AS (
    SELECT q.id FROM dispatch_queue q
    WHERE q.id IN (SELECT id FROM mine)
       OR q.id IN (SELECT f.id FROM dispatch_queue f JOIN mine m
                   ON m.kind = 'start' AND f.org_id = m.org_id AND f.agent_session_id = m.agent_session_id
                      AND f.seq > m.seq AND f.orchestrator_id = m.orchestrator_id)
    ORDER BY q.seq
    FOR UPDATE
), news AS (
    SELECT 'stopped' AS kind, %(id)s::uuid AS told_session,
           'Cancelled by an operator before any machine started working on it.' AS body
),
-- include: cancel_doomed
SELECT (SELECT count(*) FROM cancelled WHERE id = %(id)s) AS cancelled,
       (SELECT count(*) FROM cancelled) AS with_behind,
       (SELECT array_agg(id) FROM told) AS notice_ids;

-- name: session_move
-- Owner: the queue (with the sessions that follow their rows, in one statement).
-- queued -> queued on another machine (an operator's move): an unclaimed start, and the unclaimed
-- messages of its agent session queued behind it on the machine it leaves (`moving`), go to
-- `target`, an active machine of the same org and Linear user as the one it leaves (its row FOR
-- KEY SHARE, as `enqueue` locks it), in one statement; the NOTIFY wakes it on commit. No row
-- moved: nothing was written (the row is claimed, or the target is not such a machine).
WITH dest AS (
    SELECT o.id, o.listening_until > now() AS listening
    FROM orchestrators o
    JOIN orchestrators src ON src.id = %(source)s
    WHERE o.id = %(target)s AND o.id <> src.id AND o.revoked_at IS NULL
      AND o.org_id = src.org_id AND o.linear_user_id = src.linear_user_id
    FOR KEY SHARE OF o
), rows AS (
    SELECT q.id, q.org_id, q.agent_session_id, q.seq, q.orchestrator_id AS source, d.id AS target
    FROM dispatch_queue q
    JOIN dispatch_sessions s ON s.id = q.session_id AND s.kind = 'start'
    CROSS JOIN dest d
    WHERE q.session_id = %(id)s AND q.orchestrator_id = %(source)s AND q.lease_expires_at IS NULL
    FOR UPDATE OF q
), moving AS (
-- include: moving
), going AS (
    SELECT m.id, m.source, m.target FROM dispatch_queue q JOIN moving m ON m.id = q.id ORDER BY q.seq FOR UPDATE OF q
),
-- include: move_unclaimed
SELECT (SELECT count(*) FROM sessions) AS moved, (SELECT name FROM orchestrators WHERE id = %(target)s) AS target_name,
       (SELECT count(pg_notify('devpilot_dispatch', d.id::text)) FROM dest d
        WHERE d.listening AND EXISTS (SELECT 1 FROM moved)) AS notified;

-- name: revoke_move_starts
-- Owner: the queue (with the sessions that follow their rows, in one statement).
-- In the revoke transaction, after `orchestrator_revoke`: the revoked machine's undelivered
-- `start` messages (queued, or claimed with a token that no longer works) move to the same user's
-- most recently seen active machine, due at once if they were claimed, with the prompts queued
-- behind them (`moving`: no machine has those conversations yet); the NOTIFY wakes that machine on
-- commit. Nothing moves when there is no such machine (revoke_cancel_rest then cancels them).
-- Never stranded.
WITH target AS (
    SELECT o.id FROM orchestrators o JOIN orchestrators r ON r.id = %(id)s
    WHERE o.org_id = r.org_id AND o.linear_user_id = r.linear_user_id AND o.revoked_at IS NULL AND o.id <> r.id
    ORDER BY o.last_seen_at DESC NULLS LAST, o.created_at DESC, o.id
    LIMIT 1
), rows AS (
    SELECT q.id, q.org_id, q.agent_session_id, q.seq, q.orchestrator_id AS source, t.id AS target
    FROM dispatch_queue q
    JOIN dispatch_sessions s ON s.id = q.session_id AND s.kind = 'start'
    CROSS JOIN target t
    WHERE q.orchestrator_id = %(id)s
), moving AS (
-- include: moving
), locked AS (
    -- In queue order (seq), not in the order the join meets them: the sweep dead-lettering a
    -- start holds its row, then deletes the rows behind it; holding one of those while waiting for
    -- the start's would deadlock with it. Rows gone by then are skipped.
    SELECT q.id FROM dispatch_queue q JOIN moving m ON m.id = q.id
    ORDER BY q.seq
    FOR UPDATE OF q
), moved AS (
    UPDATE dispatch_queue q
    SET orchestrator_id = r.target, lease_expires_at = NULL, claimed_at = NULL,
        available_at = CASE WHEN q.lease_expires_at IS NULL THEN q.available_at ELSE now() END
    FROM locked l JOIN moving r ON r.id = l.id
    WHERE q.id = l.id AND q.orchestrator_id = r.source
    RETURNING q.session_id, r.target AS orchestrator_id
),
-- include: sessions_follow
SELECT (SELECT count(*) FROM sessions) AS moved,
       (SELECT pg_notify('devpilot_dispatch', id::text) FROM target WHERE EXISTS (SELECT 1 FROM moved)) AS woken;

-- name: revoke_cancel_rest
-- Owner: the queue (with the sessions cancelled and Linear's notices, in one statement).
-- In the revoke transaction, after revoke_move_starts: whatever the revoked machine still holds
-- (the prompts and stops of conversations it already had, and starts nobody else could take, with
-- what was queued behind them) is cancelled (`cancel_doomed`); an agent session whose start is
-- cancelled hears why in Linear (for orgs Linear is told about).
-- Its rows are locked in queue order (seq), as `revoke_move_starts` and a stop do: see `doomed`
-- in `cancel_agent_session` for the deadlock with the sweep that any other order risks.
WITH doomed AS (
    SELECT id FROM dispatch_queue WHERE orchestrator_id = %(id)s ORDER BY seq FOR UPDATE
), news AS (
    SELECT 'failed' AS kind, NULL::uuid AS told_session,
           'The machine this was queued for was removed from devpilot, and no other machine of yours is registered.' AS body
),
-- include: cancel_doomed
SELECT (SELECT count(*) FROM cancelled) AS cancelled, (SELECT array_agg(id) FROM told) AS notice_ids;

-- name: cancel_doomed
-- A fragment, after a CTE `doomed` (queue rows, locked in queue order) and a CTE `news` (one row:
-- what an agent session whose start is cancelled hears, its notice's `kind` and `body`, and
-- `told_session`, the one session told, or NULL: every one): the rows deleted, their sessions
-- cancelled (`cancel_removed`, with %(reason)s), and, for an org Linear is told about, each
-- cancelled start of an agent session told, all in the statement that deletes the rows, so the
-- sessions and what Linear hears commit with them. Serves session_cancel and revoke_cancel_rest.
removed AS (
    DELETE FROM dispatch_queue dq USING doomed WHERE dq.id = doomed.id RETURNING dq.session_id
),
-- include: cancel_removed
, told AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
    SELECT c.org_id, c.id, n.kind, c.agent_session_id, c.issue_id, n.body
    FROM cancelled c CROSS JOIN news n
    WHERE (n.told_session IS NULL OR c.id = n.told_session)
      AND c.agent_session_id IS NOT NULL AND c.kind = 'start' AND EXISTS (SELECT FROM devpilot_notified(c.org_id))
    RETURNING id
)

-- name: move_unclaimed
-- A fragment, after a CTE `going` (id, source, target: the rows to move, locked or picked): each
-- one still on its source and unclaimed moves to its target (`moved`), and its session follows
-- (`sessions_follow`), in the same statement. Serves session_move and reroute_quiet_move.
moved AS (
    UPDATE dispatch_queue q SET orchestrator_id = g.target
    FROM going g
    WHERE q.id = g.id AND q.orchestrator_id = g.source AND q.lease_expires_at IS NULL
    RETURNING q.session_id, q.orchestrator_id
),
-- include: sessions_follow

-- name: sessions_follow
-- A fragment, after a CTE `moved` (session_id, orchestrator_id: queue rows that changed machine):
-- their sessions name the machine their row is on now (`sessions`), in the same statement.
sessions AS (
    UPDATE dispatch_sessions s SET orchestrator_id = m.orchestrator_id, updated_at = now()
    FROM moved m WHERE s.id = m.session_id
    RETURNING s.id, s.orchestrator_id
)

-- name: session_routing_note
-- In the routing transaction (`shared.delivery.routing`): how the new session's machine was chosen, for its
-- page.
UPDATE dispatch_sessions SET routing_note = %(note)s WHERE id = %(id)s;
