-- 0012: an issue's turn, so that the assignment of an existing issue can be one statement.
--
-- The intake transactions of one issue's assignment events (created with an assignee, assigned,
-- re-assigned, unassigned) take turns, as those of one agent session do: an advisory lock on the
-- issue held until commit. Inside the turn, "is anything of this issue still undelivered?" has one
-- answer until the commit, so two assignments of one issue never both find nothing to cancel and
-- both dispatch (before this, two concurrent re-assignments could).

-- The turn's lock key (one place for the intake transaction's blocking lock and the statement's try).
CREATE OR REPLACE FUNCTION devpilot_issue_turn_key(org text, issue text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN hashtextextended(org || '/issue/' || issue, 0);

-- For the group commit's one statement (`route_and_enqueue_many_for_delivery`): takes the issue's
-- turn without waiting and answers whether the issue has nothing undelivered, in which case its
-- assignment is the same work as a creation (nothing to cancel first). False when another
-- transaction has the turn, or when there is something to cancel: then the statement writes
-- nothing for that issue, and the full intake transaction decides it (waiting for the turn).
--
-- VOLATILE and PL/pgSQL on purpose: the probe runs with a snapshot taken after the lock is held
-- (a VOLATILE function's queries each take a fresh one, where the calling statement's snapshot
-- is older than the lock), so a dispatch committed by the turn's previous holder is seen; and a
-- PL/pgSQL function is never inlined into the calling statement. The probe reads the partial index
-- dispatch_sessions_open_issue_idx.
CREATE OR REPLACE FUNCTION devpilot_issue_turn_free(org text, issue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(devpilot_issue_turn_key(org, issue)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (
        SELECT FROM dispatch_sessions
        WHERE org_id = $1 AND issue_id = $2 AND status = 'queued' AND agent_session_id IS NULL
    );
END
$$;
