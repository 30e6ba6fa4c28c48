-- 0015: an issue's assignment events take effect in the order Linear made them.
--
-- Linear retries a delivery that failed (about 1 min, 1 h and 6 h later), and a webhook the service
-- could not write is answered 503 on purpose so that Linear delivers it again. So an assignment can
-- be handled after a later change of the same issue: assigned to A (the delivery fails), then
-- re-assigned to B (B's machine gets the start), then A's retry cancelled B's start and dispatched
-- to A, though the issue is B's; or, unassigned in between, the retry started work on an issue
-- nobody is assigned. Each assignment event (an issue created with an assignee, its assignee
-- changed or removed, the issue removed) now records when Linear made the change
-- (`data.updatedAt`; a removal a microsecond after it, `shared/linear.py`) with its delivery, and
-- one older than a change already recorded for the issue does nothing.

ALTER TABLE webhook_deliveries
    ADD COLUMN IF NOT EXISTS org_id text,
    ADD COLUMN IF NOT EXISTS issue_id text,
    ADD COLUMN IF NOT EXISTS event_at timestamptz;

-- Serves "was a later assignment change of this issue handled?". Only assignment events are in it
-- (edits, most of what a workspace sends, have no `event_at`). Kept as long as the delivery
-- records (`prune_deliveries`), far past Linear's last retry.
CREATE INDEX IF NOT EXISTS webhook_deliveries_issue_event_idx
    ON webhook_deliveries (org_id, issue_id, event_at) WHERE event_at IS NOT NULL;

-- Whether an assignment event of the issue made by Linear at `at` is older than one already
-- recorded (strictly: two deliveries of one change, or two changes within Linear's millisecond,
-- supersede neither). False when `at` is NULL (an event without a readable `updatedAt` orders
-- against nothing). Called with the issue's turn held: by the intake transaction's
-- `record_delivery`, after the turn it takes, and by `devpilot_issue_turn_free` below. VOLATILE
-- PL/pgSQL, so that its query takes a snapshot of its own, after the turn was granted: a later
-- change committed by the turn's previous holder is seen, though the calling statement's own
-- snapshot is older than the lock.
CREATE OR REPLACE FUNCTION devpilot_issue_event_superseded(org text, issue text, at timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN at IS NOT NULL AND EXISTS (
        SELECT FROM webhook_deliveries d WHERE d.org_id = org AND d.issue_id = issue AND d.event_at > at
    );
END
$$;

-- The group commit's test for an issue's start (`route_and_enqueue_many_for_delivery`): its turn
-- and nothing undelivered to cancel (0012's two-argument form), and no later assignment change of
-- the issue handled. False: nothing is written for it, and the intake transaction decides.
-- VOLATILE PL/pgSQL as 0012's: each query takes a snapshot after the turn was granted.
CREATE OR REPLACE FUNCTION devpilot_issue_turn_free(org text, issue text, event_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT devpilot_issue_turn_free(org, issue) THEN
        RETURN false;
    END IF;
    RETURN NOT devpilot_issue_event_superseded(org, issue, event_at);
END
$$;
