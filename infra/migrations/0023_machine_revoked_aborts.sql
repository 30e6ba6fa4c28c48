-- 0023: a statement that finds the machine it was to queue for revoked aborts its transaction.
--
-- A webhook's transaction sent at once (`shared.plumbing.db.together`) has no moment between its
-- statements at which the caller could look at what the enqueue wrote and roll back: the enqueue of
-- a re-assignment whose chosen machine was revoked meanwhile (its row read FOR KEY SHARE finds it
-- revoked, and nothing is written for it) calls this instead, and the transaction rolls back whole,
-- with the delivery's record. The caller knows the error by its code (`DPREV`) and decides again,
-- now seeing the revoke (`shared.delivery.queue.MachineRevoked`).
CREATE OR REPLACE FUNCTION devpilot_machine_revoked(machine uuid) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'orchestrator % is not active', machine USING ERRCODE = 'DPREV';
END
$$;
