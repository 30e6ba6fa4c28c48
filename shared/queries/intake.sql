-- Webhook intake: the statements of the one transaction that records a Linear delivery with
-- whatever it causes (see shared/delivery/intake.py), and the routing choice made inside it.

-- name: record_delivery
-- Idempotency as a constraint: a delivery is known by its Linear-Delivery id (`key`) and by its
-- content (`content_key`: the same change through two webhooks, or a replay under a new id). The
-- first transaction to insert either key wins; a concurrent duplicate waits on the key and then
-- inserts nothing (no "select, then insert" race). No row returned: seen before.
-- For an event of an agent session (`agent_session_id`; NULL for any other), it first takes that
-- agent session's turn (`agent_session_turn`): one round trip less than a statement of its own.
-- For an agent session `created` (`created`), why it may not start (`seen`: 'started' or
-- 'stopped', `devpilot_agent_session_seen`, migration 0014, read after the agent session's turn),
-- or NULL when it may. (An issue's assignment events are recorded by their own statement,
-- `issue_changes_for_delivery`, which takes the issue's turn.)
WITH turn AS (
-- include: agent_session_turn
)
INSERT INTO webhook_deliveries (delivery_key, content_key, org_id)
SELECT %(key)s, %(content_key)s, %(org_id)s
WHERE (SELECT count(*) FROM turn) >= 0  -- (true: the turn comes first)
ON CONFLICT DO NOTHING
RETURNING delivery_key,
          CASE WHEN %(created)s THEN devpilot_agent_session_seen(%(org_id)s, %(agent_session_id)s, true) END AS seen;

-- name: take_turns
-- `record_delivery` for the stops of one transaction written together (a batch of the group
-- commit of stops: `shared.delivery.intake._stop_agent_sessions`), in one statement, and each
-- one's verdict kept for the statements sent after it in the same transaction
-- (`shared.plumbing.db.together`): they read it, in SQL, rather than waiting here for a decision
-- between them, so the whole transaction is sent at once. `batch`: a JSON array, one element per
-- delivery, numbered `n`, with its keys, org and agent session; their keys are distinct (the
-- caller leaves copies out: a key twice would match one inserted record twice).
-- * `turns`: every element's agent session turn (`agent_session_turn`), taken waiting, before
--   anything is written, in the order of the turns' keys (a turn is re-entrant: one key twice is
--   taken once). Every transaction that holds several turns takes them in that order, so two of
--   them never wait for each other in a circle, and none waits for a turn while it holds a row
--   lock (the deliveries are inserted after the last turn).
-- * the deliveries inserted ON CONFLICT DO NOTHING: a delivery seen before, or a concurrent copy
--   once that commits, gets no row and no verdict.
-- The verdict, kept under each element's `n`, local to the transaction: `devpilot.verdict_<n>`:
-- 'go' when this transaction recorded the delivery; unset (NULL or '') when it was seen before:
-- this transaction recorded nothing, and a statement reading the verdict writes nothing, the
-- delivery's record included. (A stop is never declined: it ends whatever came before it.)
-- One row per delivery recorded, in the order of `n`.
WITH want AS (  -- (one JSON array: the client dumps it in C)
    SELECT * FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(n int, key text, content_key text, org_id text, agent_session_id text)
), turns AS MATERIALIZED (  -- (each lock taken as the sorted keys come: in key order)
    SELECT pg_advisory_xact_lock(k.key) FROM (
        SELECT DISTINCT devpilot_agent_session_turn_key(w.org_id, w.agent_session_id) AS key
        FROM want w ORDER BY 1 OFFSET 0
    ) k
), recorded AS (
    INSERT INTO webhook_deliveries (delivery_key, content_key, org_id)
    SELECT w.key, w.content_key, w.org_id FROM want w
    WHERE (SELECT count(*) FROM turns) >= 0  -- (true: the turns come first)
    ON CONFLICT DO NOTHING
    RETURNING delivery_key
)
SELECT w.n, set_config('devpilot.verdict_' || w.n, 'go', true) AS verdict
FROM recorded d JOIN want w ON w.key = d.delivery_key
ORDER BY w.n;

-- name: delivery_session
-- For a duplicate: the session the first delivery created (committed, so visible here).
SELECT session_id, outcome FROM webhook_deliveries
WHERE delivery_key = %(key)s OR content_key = %(content_key)s
ORDER BY session_id IS NULL, received_at
LIMIT 1;

-- name: record_ignored
-- Deliveries that do nothing (an issue edited without its assignee changing, an event type we do
-- not handle), one or several (`batch`, a JSON array of their two keys): only their keys are
-- recorded, as `ignored`, in one statement that is its own transaction (several that arrive
-- together commit together, `shared.delivery.intake`). ON CONFLICT DO NOTHING, as `record_delivery`: a
-- delivery seen before, or a concurrent copy once that commits, writes nothing and returns no row,
-- and its caller answers it `duplicate` through the intake transaction. The elements' keys are
-- distinct (the caller leaves copies out).
INSERT INTO webhook_deliveries (delivery_key, content_key, outcome)
SELECT w.key, w.content_key, 'ignored'
FROM jsonb_to_recordset(%(batch)s::jsonb) AS w(key text, content_key text)
ON CONFLICT DO NOTHING
RETURNING delivery_key;

-- name: prune_deliveries
-- Forgets the oldest delivery records received before the retention (`hours`), at most `batch` of
-- them, by webhook_deliveries_received_idx, and as many of the agent sessions' stops
-- (`record_stop`), by agent_session_stops_stopped_idx. A record is what makes a retry a duplicate, and Linear
-- retries a delivery about 1 min, 1 h and 6 h after it first failed, so a record kept for a day
-- or more outlives every retry; kept for ever, every webhook a workspace sends (each edit of each
-- issue) would stay in the table and its three indexes. One statement, its own transaction;
-- concurrent sweeps split the rows between them (SKIP LOCKED) and never count one twice. Each row
-- is deleted by its key, or its place (`ctid`, held by the row lock), from an array: as a join of
-- the picked rows, the plan kept for every value read the whole table (bench/year.py's plan test).
WITH old AS (
    SELECT delivery_key FROM webhook_deliveries
    WHERE received_at < coalesce(%(now)s::timestamptz, now()) - make_interval(hours => %(hours)s)
    ORDER BY received_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM webhook_deliveries d WHERE d.delivery_key = ANY (ARRAY(SELECT delivery_key FROM old))
    RETURNING 1
), old_stops AS (  -- (the stops of agent sessions, kept as long: `record_stop`)
    SELECT ctid AS place FROM agent_session_stops
    WHERE stopped_at < coalesce(%(now)s::timestamptz, now()) - make_interval(hours => %(hours)s)
    ORDER BY stopped_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), stops_gone AS (
    DELETE FROM agent_session_stops st WHERE st.ctid = ANY (ARRAY(SELECT place FROM old_stops))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone) AS pruned, (SELECT count(*) FROM stops_gone) AS stops_pruned;

-- name: finish_delivery
-- In the intake transaction: what the delivery did, committed with its rows.
UPDATE webhook_deliveries SET session_id = %(session_id)s, outcome = %(outcome)s
WHERE delivery_key = %(key)s;

-- name: agent_session_turn
-- A fragment (in `record_delivery`): serialises the intake transactions of one agent session
-- (created, prompted, stop) until commit, so their messages take their queue order (seq) in commit
-- order and a stop sees every earlier one, the start still committing included. Every statement
-- after it in the transaction reads a snapshot taken after the turn was granted. The group commit
-- of agent sessions `created` waits for the same turn in its statement; the follow-ups' tries it
-- without waiting (`devpilot_agent_session_holder`, migration 0013: one key).
SELECT pg_advisory_xact_lock(devpilot_agent_session_turn_key(%(org_id)s, %(agent_session_id)s))
WHERE %(agent_session_id)s::text IS NOT NULL

-- name: record_stop
-- In a transaction of stops, after their agent sessions' turns: each agent session of `batch` (a
-- JSON array, one element per stop: `n`, `org_id`, `agent_session_id`, `at`) is stopped, so a
-- `created` of it handled later (Linear's retry of a delivery that failed, or one that reached
-- another instance first) starts nothing (`devpilot_agent_session_seen`), nor does a follow-up
-- written at or before the stop (`at`, when the person pressed it; NULL: unknown, and no
-- follow-up is held back by this stop; `devpilot_agent_session_stopped_since`). The latest stop's
-- time is kept, and the record is kept from the latest stop on (`prune_deliveries`). The agent
-- session's dead letters at this moment are marked stopped (`letters`, migration 0017): an
-- operator's retry never queues one of them again (`retry_overtaken`). Run after the stops'
-- cancel (`cancel_agent_session`): a message dead-lettered by a release or the sweep while the
-- stop ran (a follow-up's is, without the turn) held its queue row, the cancel waited for that
-- commit, and this statement's snapshot, taken after, sees its dead letter.
-- Sent after `take_turns`: for each element only when that statement recorded its delivery
-- (`devpilot.verdict_<n>` 'go'; `n` NULL: an element used alone, always). Elements of one agent
-- session are written as one stop, the latest `at` kept.
WITH go AS (
    SELECT w.* FROM jsonb_to_recordset(%(batch)s::jsonb)
        AS w(n int, org_id text, agent_session_id text, at timestamptz)
    WHERE w.n IS NULL OR current_setting('devpilot.verdict_' || w.n, true) = 'go'
), letters AS (
    UPDATE dead_letters d SET stopped_at = now()
    FROM go JOIN dispatch_sessions s ON s.org_id = go.org_id AND s.agent_session_id = go.agent_session_id
    WHERE s.status = 'failed' AND d.session_id = s.id AND d.stopped_at IS NULL
)
INSERT INTO agent_session_stops (org_id, agent_session_id, last_stop_at)
SELECT go.org_id, go.agent_session_id, max(go.at) FROM go GROUP BY go.org_id, go.agent_session_id
ON CONFLICT (org_id, agent_session_id) DO UPDATE
SET stopped_at = excluded.stopped_at,
    last_stop_at = greatest(agent_session_stops.last_stop_at, excluded.last_stop_at);

-- name: route
-- A fragment, the routing policy (in the starts' statements, `issue_changes_for_delivery` and
-- `route_and_start_agent_sessions_many_for_delivery`): the active
-- orchestrator registered for (org, Linear user), most recently seen first, then the newest
-- registration. For each row of `want` (org_id, route_user): a LATERAL subquery. Served by
-- orchestrators_route_idx.
-- `mixed`: the user's active machines do not all have the same repositories and labels (their
-- `routing_shape`). Such a start needs the repository first (Linear is asked, after commit): the
-- statements that route write a routing request for it instead.
-- The window aggregate reads the same index scan (every machine of the user, a handful), so the
-- one statement of a user whose machines are alike reads nothing more than it did.
SELECT id, min(routing_shape) OVER () <> max(routing_shape) OVER () AS mixed FROM orchestrators
WHERE org_id = want.org_id AND linear_user_id = want.route_user AND revoked_at IS NULL
ORDER BY last_seen_at DESC NULLS LAST, created_at DESC, id
LIMIT 1
