-- A page per session (shared/operators/sessions.py): what it shows, the search that finds it, and the
-- operators' actions (retry, cancel, move): each one transaction, which takes the locks here,
-- makes its queue write through `shared.delivery.queue` (queue.sql, the queue's owner: `session_requeue`,
-- `session_cancel`, `session_move`, which keep the invariant: a session is `queued` exactly while
-- one queue row holds it) and records who did what (`session_actions`, this file's table).

-- name: session_header
-- The session, its machine (and how it was chosen, when routing by repository said so: for a
-- follow-up or a stop, the note of the start it follows, as they go where the start went), its
-- queue row while it is queued, its workspace's Linear connection (none, or disconnected:
-- nothing reaches Linear until it is connected again), and until when its workspace's posts wait
-- for Linear's rate limit, if they do (read-only).
SELECT s.id, s.org_id, s.status, s.kind, s.issue_id, s.issue_identifier, s.agent_session_id,
       s.agent_session_created, s.linear_user_id, s.failure_reason,
       coalesce(s.routing_note, (
           SELECT st.routing_note FROM dispatch_sessions st
           WHERE s.kind <> 'start' AND st.org_id = s.org_id AND st.agent_session_id = s.agent_session_id
             AND st.kind = 'start' AND st.created_at <= s.created_at
           ORDER BY st.created_at DESC LIMIT 1)) AS routing_note,
       s.created_at,
       s.updated_at,
       s.delivered_at, s.claimed_at, s.orchestrator_id, o.name AS machine, o.revoked_at AS machine_revoked_at,
       q.attempts AS live_attempts, q.claimed_at AS live_claimed_at, q.lease_expires_at, q.available_at,
       q.last_error AS live_error, q.payload AS live_payload,
       d.payload AS dead_payload, d.reason AS dead_reason, d.failed_at AS dead_at, d.attempts AS dead_attempts,
       -- The workspace's name: as the OAuth install learned it, else as a person who signed in
       -- from it saw it (a static token names none); by linear_people's key, one row.
       coalesce(c.workspace_name, (
           SELECT lp.workspace_name FROM linear_people lp
           WHERE lp.org_id = s.org_id ORDER BY lp.updated_at DESC LIMIT 1)) AS workspace_name,
       c.org_id IS NOT NULL AS linear_known, c.disconnected_at AS linear_disconnected_at,
       c.disconnect_reason AS linear_disconnect_reason,
       p.blocked_until AS paced_until, p.budget AS ratelimit_budget
FROM dispatch_sessions s
JOIN orchestrators o ON o.id = s.orchestrator_id
LEFT JOIN dispatch_queue q ON q.session_id = s.id
LEFT JOIN dead_letters d ON d.session_id = s.id
LEFT JOIN linear_credentials c ON c.org_id = s.org_id
LEFT JOIN linear_paces p ON p.org_id = s.org_id AND p.blocked_until > now()
WHERE s.id = %(id)s;

-- name: session_conversation
-- Every message of the session's conversation, in the order they were queued: the agent
-- session's messages, or the session alone (a plain assignment), with their machines, queue rows
-- and dead letters. Served by dispatch_sessions_agent_idx.
SELECT s.id, s.kind, s.status, s.created_at, s.claimed_at, s.delivered_at, s.failure_reason,
       s.orchestrator_id, o.name AS machine,
       q.attempts AS live_attempts, q.claimed_at AS live_claimed_at, q.last_error AS live_error,
       q.lease_expires_at, q.available_at,
       d.reason AS dead_reason, d.failed_at AS dead_at, d.attempts AS dead_attempts
FROM dispatch_sessions s
JOIN orchestrators o ON o.id = s.orchestrator_id
LEFT JOIN dispatch_queue q ON q.session_id = s.id
LEFT JOIN dead_letters d ON d.session_id = s.id
WHERE (s.id = %(id)s
       OR (%(agent_session_id)s::text IS NOT NULL AND s.org_id = %(org_id)s
           AND s.agent_session_id = %(agent_session_id)s))
ORDER BY s.created_at, s.id
LIMIT 500;

-- name: session_attempts
-- The claims of these sessions that ended without an ack, in order.
SELECT session_id, attempt, claimed_at, ended_at, error
FROM dispatch_attempts WHERE session_id = ANY(%(ids)s::uuid[])
ORDER BY session_id, id;

-- name: session_posts
-- What was posted to Linear (or waits) for the conversation, in the order accepted: the agent
-- session's posts (and those under a plain assignment's alias), and the issue's own (state,
-- delegate) written for its sessions; `given_up` past the attempt limit (available_at is
-- 'infinity', which no client datetime holds), `superseded_by` an ephemeral activity replaced
-- before it was sent (not sent, not given up). At most 1,000, the newest.
SELECT * FROM (
    SELECT n.id, n.kind, n.body, n.content, n.signal, n.signal_metadata, n.ephemeral, n.created_at, n.sent_at,
           n.attempts, n.last_error,
           n.available_at = 'infinity' AND n.superseded_by IS NULL AS given_up, n.superseded_by,
           CASE WHEN n.available_at < 'infinity' THEN n.available_at END AS next_at,
           n.linear_id, n.orchestrator_id IS NOT NULL AS by_agent, n.seq
    FROM linear_notices n
    WHERE n.org_id = %(org_id)s
      AND (n.agent_session_id = ANY(%(agent_sessions)s::text[]) OR n.session_id = ANY(%(ids)s::uuid[]))
    ORDER BY n.seq DESC
    LIMIT 1000
) newest ORDER BY seq;

-- name: session_actions_list
SELECT action, actor, detail, at FROM session_actions WHERE session_id = ANY(%(ids)s::uuid[]) ORDER BY id;

-- name: session_search
-- Sessions by issue identifier (`ENG-123`, any case), agent session id, session id (`id`: the
-- text, when it is one) or machine name, newest first; with no text, the most recently changed.
-- Each way is an index's few entries, whatever is kept: the identifier by
-- dispatch_sessions_identifier_idx; the agent session by dispatch_sessions_agent_idx, in each org
-- that has a machine (a session's org is its machine's); the machine's by
-- dispatch_sessions_machine_idx (migration 0022); the most recently changed by
-- dispatch_sessions_status_idx, `limit` of each status. The sessions found are then read by key.
-- (Written as one condition with ORs, it read every session: 109,064 rows of 110,000 in
-- tests/test_plans_at_scale.py.)
WITH found AS (
    SELECT s.id FROM (
        SELECT s.id FROM dispatch_sessions s
        WHERE upper(s.issue_identifier) = upper(%(q)s) AND s.issue_identifier IS NOT NULL
        ORDER BY upper(s.issue_identifier), s.created_at DESC
        LIMIT %(limit)s
    ) s
    UNION
    SELECT s.id FROM (SELECT DISTINCT org_id FROM orchestrators) o
    CROSS JOIN LATERAL (
        SELECT s.id FROM dispatch_sessions s
        WHERE s.org_id = o.org_id AND s.agent_session_id = %(q)s
        ORDER BY s.created_at DESC
        LIMIT %(limit)s
    ) s
    UNION
    SELECT s.id FROM dispatch_sessions s WHERE s.id = %(id)s
    UNION
    SELECT s.id FROM orchestrators o
    CROSS JOIN LATERAL (
        SELECT s.id FROM dispatch_sessions s WHERE s.orchestrator_id = o.id
        ORDER BY s.created_at DESC
        LIMIT %(limit)s
    ) s
    WHERE lower(o.name) = lower(%(q)s)
    UNION
    SELECT s.id FROM (VALUES ('queued'), ('delivered'), ('failed'), ('cancelled')) AS st(status)
    CROSS JOIN LATERAL (
        SELECT s.id FROM dispatch_sessions s WHERE s.status = st.status
        ORDER BY s.updated_at DESC
        LIMIT %(limit)s
    ) s
    WHERE %(q)s::text IS NULL
)
SELECT s.id, s.org_id, s.status, s.kind, s.issue_identifier, s.agent_session_id, s.created_at, s.updated_at,
       o.name AS machine
FROM dispatch_sessions s
JOIN orchestrators o ON o.id = s.orchestrator_id
WHERE s.id = ANY (ARRAY(SELECT id FROM found))
ORDER BY CASE WHEN %(q)s::text IS NULL THEN s.updated_at ELSE s.created_at END DESC, s.id
LIMIT %(limit)s;

-- name: session_turn_peek
-- Before an operator's cancel, move or retry (`shared.operators.sessions`): the session's agent session,
-- whose turn the action takes first, waiting, as a stop or a follow-up takes it before anything
-- else. The messages queued behind a start go with it, so the action's statement, whose snapshot
-- is taken after the turn, must see every one of them: without the turn, a follow-up committed
-- while it ran would be left behind a start gone elsewhere or cancelled, or (a retry) a follow-up
-- or a stop would have changed the conversation unseen (`retry_overtaken`). (Read without a lock:
-- a session's org and agent session never change.)
SELECT org_id, agent_session_id FROM dispatch_sessions
WHERE id = %(id)s AND agent_session_id IS NOT NULL;

-- name: session_queue_lock
-- Before `session_lock`, in an operator's action: the session's queue row, if it has one, locked
-- first. An ack (and a stop, a revoke, the sweep) locks a queue row before its session's row; an
-- action that locked them the other way round could wait for an ack that waits for it, and
-- Postgres would abort one of the two.
SELECT id FROM dispatch_queue WHERE session_id = %(id)s FOR UPDATE;

-- name: session_lock
-- The session, locked for an operator's action (the action's transaction decides on this row).
SELECT s.id, s.org_id, s.status, s.kind, s.agent_session_id, s.issue_id, s.linear_user_id,
       s.orchestrator_id, o.revoked_at AS machine_revoked_at, o.linear_user_id AS machine_user
FROM dispatch_sessions s JOIN orchestrators o ON o.id = s.orchestrator_id
WHERE s.id = %(id)s
FOR UPDATE OF s;

-- name: retry_overtaken
-- Before an operator's retry of a failed message of an agent session, its turn held
-- (`session_turn_peek`), so that no follow-up or stop of it commits meanwhile: what its
-- conversation did since, which the retry must not undo or fork. No row: no agent session.
-- * `stopped`: the person stopped the agent session while this message was failed (`record_stop`
--   marked its dead letter): a retry would start work they stopped.
-- * `holder`: the machine that has the conversation now (`devpilot_agent_session_holder`: the
--   newest message of the agent session queued or delivered on an active machine; this failed one
--   is neither; the turn is this transaction's, and re-entrant), or NULL. A start is retried only
--   while there is none: a follow-up handled after the start failed started the conversation
--   afresh, and a retry would start it a second time. Any other message (a follow-up, a stop) only
--   on the machine that has the conversation: elsewhere it would reach a machine that never started
--   it (its start failed too: retry that first).
SELECT
    EXISTS (SELECT 1 FROM dead_letters d WHERE d.session_id = s.id AND d.stopped_at IS NOT NULL) AS stopped,
    (SELECT h.orchestrator_id FROM devpilot_agent_session_holder(s.org_id, s.agent_session_id, false) h) AS holder
FROM dispatch_sessions s
WHERE s.id = %(id)s AND s.agent_session_id IS NOT NULL;

-- name: session_action_record
-- Who did what to the session, in the action's own transaction.
INSERT INTO session_actions (session_id, action, actor, detail)
VALUES (%(id)s, %(action)s, %(actor)s, %(detail)s);

-- name: session_machines
-- The other active machines of the same org and Linear user as `orchestrator_id` (a move's targets).
SELECT o.id, o.name FROM orchestrators o JOIN orchestrators src ON src.id = %(orchestrator_id)s
WHERE o.id <> src.id AND o.revoked_at IS NULL AND o.org_id = src.org_id AND o.linear_user_id = src.linear_user_id
ORDER BY o.name, o.id;

-- name: machine_by_name
-- A machine named in the CLI (`--to NAME`): an active one of that name (or id), newest first.
SELECT id FROM orchestrators
WHERE (lower(name) = lower(%(name)s) OR id::text = lower(%(name)s)) AND revoked_at IS NULL
ORDER BY created_at DESC LIMIT 2;
