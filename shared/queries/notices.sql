-- Telling Linear what happened: the `linear_notices` outbox and the org credentials it posts with.

-- name: notice_insert
-- In the caller's transaction: the notice commits with the state change that causes it, or not at
-- all; nothing is written for an org Linear is not told about.
INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
SELECT %(org_id)s, %(session_id)s, %(kind)s, %(agent_session_id)s, %(issue_id)s, %(body)s
WHERE EXISTS (SELECT FROM devpilot_notified(%(org_id)s))
RETURNING id;

-- name: notice_take
-- Takes the named notices (by id, or by agent session: the send after a commit, and every next
-- round, the sweep's included), those due and unsent, for sending (`notice_taking`). Few rows by
-- their keys; whether each one's org has a working connection is asked of that row alone. Nothing
-- when none are named.
WITH due AS (
    SELECT id FROM linear_notices n0
    WHERE (id = ANY(%(ids)s::uuid[]) OR agent_session_id = ANY(%(agent_sessions)s::text[]))
      AND EXISTS (SELECT 1 FROM linear_credentials c WHERE c.org_id = n0.org_id AND c.disconnected_at IS NULL)
-- include: notice_taking
)
-- include: notice_lease

-- name: notice_take_due
-- Takes any due, unsent notices for sending (the sweep's first round: Linear was down, or an
-- instance died between a commit and its send), by `notice_taking`. The connected orgs that are
-- not waiting for Linear's rate limit are listed first, and only their due posts are read
-- (linear_notices_due_idx: a probe per such org, about two pages each), however many posts of
-- disconnected or paced orgs wait (migrations 0019, 0021).
WITH due AS (
    SELECT id FROM linear_notices n0
    WHERE org_id = ANY (ARRAY(
            SELECT c.org_id FROM linear_credentials c
            WHERE c.disconnected_at IS NULL
              AND NOT EXISTS (SELECT 1 FROM linear_paces p WHERE p.org_id = c.org_id AND p.blocked_until > now())))
-- include: notice_taking
)
-- include: notice_lease

-- name: notice_taking
-- A fragment, the rest of the `due` CTE of `notice_take` and `notice_take_due` (each names the
-- notices it looks at, and keeps only those of orgs with a working connection: the others wait,
-- attempts untouched, for a new install). Nothing of an org that waits for Linear's rate limit
-- (`linear_paces`, shared/linear/pace.py): its posts go, in order, once the time Linear gave has passed,
-- whatever instance takes them. Due and unsent, and not leased: SKIP LOCKED and a short
-- lease (`notice_lease`), so two senders never post the same notice at once. In order per agent
-- session and lane (`devpilot_notice_lane`): not while an earlier post of its agent session and
-- lane is unsent (in flight, or waiting out its backoff), nor while the agent session is still
-- being opened (`session_create`); one given up (available_at = infinity) no longer holds the rest
-- back. At most 50 a round, written in: with the LIMIT bound, the plan kept for every value
-- assumed a tenth of the rows would be taken and leased them by a hash join over the whole table.
      AND sent_at IS NULL AND available_at <= now()
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
      AND NOT EXISTS (SELECT 1 FROM linear_paces p WHERE p.org_id = n0.org_id AND p.blocked_until > now())
      AND (n0.agent_session_id IS NULL OR NOT EXISTS (
            SELECT 1 FROM linear_notices earlier
            WHERE earlier.agent_session_id = n0.agent_session_id AND earlier.sent_at IS NULL
              AND earlier.available_at < 'infinity' AND earlier.seq < n0.seq
              AND (earlier.kind = 'session_create'
                   OR devpilot_notice_lane(earlier.kind) = devpilot_notice_lane(n0.kind))))
    ORDER BY seq
    LIMIT 50
    FOR UPDATE SKIP LOCKED

-- name: notice_lease
-- A fragment, after `due` (the notices taken, locked): each leased for 30 s and its attempt counted.
UPDATE linear_notices n SET lease_expires_at = now() + interval '30 seconds', attempts = n.attempts + 1
FROM due WHERE n.id = due.id
RETURNING n.id, n.org_id, n.kind, n.agent_session_id, n.issue_id, n.body, n.content, n.ephemeral,
          n.signal, n.signal_metadata, n.attempts, n.session_id;

-- name: notice_sent
-- Compare-and-set: marks it sent once, with Linear's id; a second success changes nothing.
UPDATE linear_notices SET sent_at = now(), linear_id = %(linear_id)s, lease_expires_at = NULL, last_error = NULL
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_wait
-- Taken, but the org's connection went away meanwhile (a refresh Linear refused): back to waiting,
-- the attempt not counted, due again as soon as the org is connected again.
UPDATE linear_notices SET lease_expires_at = NULL, attempts = greatest(attempts - 1, 0), last_error = %(error)s
WHERE id = %(id)s AND sent_at IS NULL;

-- name: notice_ratelimited
-- Taken, and Linear refused it for its rate limit: not an attempt. Back to waiting (the attempt
-- taken back, the due time untouched: it goes first once the wait is over), and the org's pace
-- recorded in the same statement (`pace_refused`): nothing of the org is taken before the time
-- Linear gave, on any instance.
WITH paced AS (
-- include: pace_refused
)
UPDATE linear_notices SET lease_expires_at = NULL, attempts = greatest(attempts - 1, 0), last_error = %(error)s
WHERE id = %(id)s AND sent_at IS NULL AND EXISTS (SELECT FROM paced);

-- name: notice_failed
-- A failed send: due again after devpilot_backoff(attempts); past the attempt limit it is given up
-- (sent_at stays NULL, available_at far away) with the error kept for operators.
UPDATE linear_notices
SET lease_expires_at = NULL, last_error = %(error)s,
    available_at = CASE WHEN attempts >= %(max_attempts)s THEN 'infinity'::timestamptz
                        ELSE now() + make_interval(secs => devpilot_backoff(attempts, %(base)s, %(cap)s)) END
WHERE id = %(id)s AND sent_at IS NULL;

-- name: activity_rights
-- May this machine speak in this agent session (a message of it was delivered to it, or `alias_of`
-- names a plain assignment delivered to it), and is the org connected to Linear? Read in the
-- transaction that then accepts the activity, after the conversation's keep lock, shared
-- (`devpilot_may_speak`, migration 0021): the retention sweep never forgets a conversation while a
-- post into it is being accepted, and one forgotten before is seen gone.
SELECT devpilot_may_speak(%(org_id)s, %(agent_session_id)s, %(orchestrator_id)s, %(alias_of)s) AS holds,
       EXISTS (SELECT FROM devpilot_notified(%(org_id)s)) AS connected;

-- name: activity_insert
-- The agent's activity into the outbox, idempotent by the caller's id (also Linear's input.id):
-- the same id again inserts nothing. Posted after commit, in acceptance order (seq). An
-- `ephemeral` activity of the agent session accepted before it and still unsent (not in flight: a
-- post being sent goes on) is not sent at all: Linear would replace it with this one at once. It
-- is marked replaced (`superseded_by`), kept for the page, and holds nothing back (available_at =
-- infinity, as a post given up). Only when this one is new: a repeated id replaces nothing.
WITH added AS (
    INSERT INTO linear_notices (id, org_id, kind, agent_session_id, body, content, ephemeral, orchestrator_id,
                                signal, signal_metadata)
    VALUES (%(id)s, %(org_id)s, 'activity', %(agent_session_id)s, %(body)s, %(content)s, %(ephemeral)s,
            %(orchestrator_id)s, %(signal)s, %(signal_metadata)s)
    ON CONFLICT (id) DO NOTHING
    RETURNING id, seq, org_id, agent_session_id
), replaced AS (
    UPDATE linear_notices n SET available_at = 'infinity', superseded_by = a.id
    FROM added a
    WHERE n.agent_session_id = a.agent_session_id AND n.sent_at IS NULL AND n.seq < a.seq
      AND n.org_id = a.org_id AND n.kind = 'activity' AND n.ephemeral AND n.available_at < 'infinity'
      AND (n.lease_expires_at IS NULL OR n.lease_expires_at < now())
)
SELECT id FROM added;

-- name: activity_same
-- For a repeated id: is it this machine's activity in this agent session (same answer again), or
-- someone else's (not found)? `alias`: the name it was given, when that was a plain assignment's alias.
SELECT EXISTS (
    SELECT 1 FROM linear_notices
    WHERE id = %(id)s AND org_id = %(org_id)s AND agent_session_id IN (%(agent_session_id)s, %(alias)s)
      AND orchestrator_id = %(orchestrator_id)s
) AS same;

-- name: activity_list
-- An agent session's activities in the order they were accepted (seq): the service's own notices
-- and the agent's, sent or waiting, for the machine that holds the agent session (checked by the
-- caller with `activity_rights`, in the same transaction). At most 1,000, the newest. `alias`: a
-- plain assignment's conversation is also what waits under its alias (or the agent session again).
SELECT * FROM (
    SELECT n.id, n.kind, n.body, n.content, n.signal, n.signal_metadata, n.created_at, n.sent_at,
           n.orchestrator_id IS NOT NULL AS by_agent, n.seq
    FROM linear_notices n
    WHERE n.org_id = %(org_id)s AND n.agent_session_id IN (%(agent_session_id)s, %(alias)s)
    ORDER BY n.seq DESC
    LIMIT 1000
) newest ORDER BY seq;

-- name: notice_session_created
-- Owner: the notices (with the session's agent session, in one statement).
-- Linear opened the agent session of a plain assignment (`session_create`), in one statement (its
-- own transaction): the post marked sent with the agent session's id, the session knows its agent
-- session (follow-ups and a stop in it reach its machine), and the posts waiting under the alias
-- `devpilot:<sessionId>` are the agent session's from now on, in the order they were accepted.
WITH sent AS (
    UPDATE linear_notices SET sent_at = now(), linear_id = %(agent_session_id)s, lease_expires_at = NULL,
                              last_error = NULL
    WHERE id = %(id)s AND sent_at IS NULL
    RETURNING session_id, agent_session_id AS alias
), opened AS (
    UPDATE dispatch_sessions s SET agent_session_id = %(agent_session_id)s, agent_session_created = true,
                                   updated_at = now()
    FROM sent WHERE s.id = sent.session_id AND s.agent_session_id IS NULL
    RETURNING s.id
)
UPDATE linear_notices n SET agent_session_id = %(agent_session_id)s
FROM sent WHERE n.agent_session_id = sent.alias AND n.id <> %(id)s;

-- name: notice_alias_gave_up
-- The agent session of a plain assignment could not be opened (given up): what waited under its
-- alias is given up with it, the reason kept for the page.
UPDATE linear_notices SET available_at = 'infinity', lease_expires_at = NULL,
                          last_error = 'no agent session in Linear to post in: ' || %(error)s::text
WHERE agent_session_id = %(alias)s AND sent_at IS NULL AND id <> %(id)s;

-- name: notice_given_up
-- Was this post given up (past the attempt limit) by its failure just now?
SELECT available_at = 'infinity' AS gave_up FROM linear_notices WHERE id = %(id)s;

-- name: plan_insert
-- The agent's plan into the outbox, in the caller's transaction (`activity_rights` first):
-- posted after commit as agentSessionUpdate(plan), in order with the agent session's other plans.
INSERT INTO linear_notices (org_id, kind, agent_session_id, body, content, orchestrator_id)
VALUES (%(org_id)s, 'plan', %(agent_session_id)s, %(body)s, %(content)s, %(orchestrator_id)s)
RETURNING id;

-- name: alias_session
-- The plain assignment an alias `devpilot:<sessionId>` names, for the machine it was delivered to:
-- the agent session Linear gave it once opened (NULL until then), and whether one is being opened
-- (a workspace without the app opens none). No row: not this machine's.
SELECT s.agent_session_id,
       EXISTS (SELECT 1 FROM linear_notices n
               WHERE n.agent_session_id = 'devpilot:' || s.id::text AND n.kind = 'session_create') AS opening
FROM dispatch_sessions s
WHERE s.id = %(session_id)s AND s.org_id = %(org_id)s AND s.orchestrator_id = %(orchestrator_id)s
  AND s.status = 'delivered' AND s.kind = 'start' AND (s.agent_session_id IS NULL OR s.agent_session_created);
