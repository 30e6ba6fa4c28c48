-- 0025: an issue's assignment change decided whole in its one statement: the issue's undelivered
-- assignment dispatches, read after the turn.
--
-- Every assignment event of an issue (created with an assignee, assigned, re-assigned,
-- unassigned, removed) is one statement (`issue_changes_for_delivery`): it waits for the issue's
-- turn, cancels what of the issue is still undelivered, and queues the start. Its own snapshot is
-- older than the turn, so a dispatch the turn's previous holder committed meanwhile is not among
-- the rows it can lock and delete. This reads the issue's undelivered sessions with a snapshot
-- taken when it runs, after the turn was granted (VOLATILE PL/pgSQL, as
-- `devpilot_issue_turn_free`, 0012): the statement compares them with what its own snapshot sees,
-- and when one is missing writes nothing for that element, which its caller writes again in a new
-- statement. It reads the partial index dispatch_sessions_open_issue_idx.
CREATE OR REPLACE FUNCTION devpilot_issue_undelivered(org text, issue text) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RETURN ARRAY(
        SELECT s.id FROM dispatch_sessions s
        WHERE s.org_id = $1 AND s.issue_id = $2 AND s.status = 'queued' AND s.agent_session_id IS NULL
    );
END
$$;
