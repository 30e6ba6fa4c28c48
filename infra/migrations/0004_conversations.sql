-- 0004: agent sessions are conversations. Every message to a machine (start, prompt, stop) is a
-- row in the same queue, with the same guarantees, delivered in order per agent session; every
-- reply to Linear (the service's own and the agent's activities) is a row of the same outbox.

-- What a message asks of the machine.
ALTER TABLE dispatch_sessions ADD COLUMN IF NOT EXISTS kind text NOT NULL DEFAULT 'start'
    CHECK (kind IN ('start', 'prompt', 'stop'));
-- Serves "which machine holds this agent session", stop's cancellation and /activities' check.
CREATE INDEX IF NOT EXISTS dispatch_sessions_agent_idx
    ON dispatch_sessions (org_id, agent_session_id, created_at DESC)
    WHERE agent_session_id IS NOT NULL;

-- The order of one agent session's messages: seq is taken under the agent session's lock (intake),
-- so it is also their commit order.
ALTER TABLE dispatch_queue ADD COLUMN IF NOT EXISTS agent_session_id text;
ALTER TABLE dispatch_queue ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;
-- Serves the claim's order rule: "is an earlier message of this agent session still undelivered?"
CREATE INDEX IF NOT EXISTS dispatch_queue_agent_order_idx
    ON dispatch_queue (org_id, agent_session_id, seq)
    WHERE agent_session_id IS NOT NULL;

-- The outbox to Linear carries activities too: their content as Linear takes it, in the order
-- they were accepted per agent session (seq), posted with the row's id as the idempotency id.
ALTER TABLE linear_notices DROP CONSTRAINT IF EXISTS linear_notices_kind_check;
ALTER TABLE linear_notices ADD CONSTRAINT linear_notices_kind_check
    CHECK (kind IN ('dispatched', 'delivered', 'failed', 'stopped', 'activity'));
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS content jsonb;
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS ephemeral boolean NOT NULL DEFAULT false;
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS orchestrator_id uuid REFERENCES orchestrators (id);
ALTER TABLE linear_notices ADD COLUMN IF NOT EXISTS seq bigint GENERATED ALWAYS AS IDENTITY;
-- Serves the sender's order rule: an earlier unsent post of the same agent session goes first.
CREATE INDEX IF NOT EXISTS linear_notices_agent_order_idx
    ON linear_notices (agent_session_id, seq)
    WHERE sent_at IS NULL AND agent_session_id IS NOT NULL;

-- A delivery is known by its Linear-Delivery id and by its content (the same change through two
-- webhooks, or a replay under a new id): one row, two unique keys, so one INSERT ... ON CONFLICT
-- DO NOTHING refuses a delivery seen under either.
ALTER TABLE webhook_deliveries ADD COLUMN IF NOT EXISTS content_key text UNIQUE;
