-- Webhook intake: the statements of the one transaction that records a Linear delivery with
-- whatever it causes (see shared/intake.py), and the routing choice made inside it.

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

-- name: route
-- Routing policy, in the intake transaction so the choice and the dispatch commit together: the
-- active orchestrator registered for (org, Linear user), most recently seen first, then the newest
-- registration. Served by orchestrators_route_idx.
SELECT id FROM orchestrators
WHERE org_id = %(org_id)s AND linear_user_id = %(linear_user_id)s AND revoked_at IS NULL
ORDER BY last_seen_at DESC NULLS LAST, created_at DESC, id
LIMIT 1;

-- name: notice_dispatched
-- In the intake transaction: "queued for <machine>" for an agent session, for orgs Linear is told
-- about (Linear shows the agent unresponsive without an activity within 10 s).
INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body)
SELECT %(org_id)s, %(session_id)s, 'dispatched', %(agent_session_id)s, %(issue_id)s, 'Queued for ' || o.name
FROM orchestrators o
WHERE o.id = %(orchestrator_id)s AND devpilot_notifies(%(org_id)s)
RETURNING id;
