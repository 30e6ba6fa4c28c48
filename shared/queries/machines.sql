-- What each machine has (shared/fleet/machines.py): the repositories and labels its orchestrator said
-- it has (`POST /machine`), which routing reads.

-- name: machine_describe
-- Owner: machines (with the machine's routing digest on its `orchestrators` row, in one statement).
-- What a machine has, as its orchestrator said last (`POST /machine`): it replaces what it said
-- before, and the digest routing compares (`route`, intake.sql) is written on the machine's row in
-- the same statement. Only an active machine. (The update of the machine's row takes no lock an
-- enqueue's FOR KEY SHARE waits for.)
WITH o AS (
    UPDATE orchestrators SET routing_shape = %(routing_shape)s
    WHERE id = %(id)s AND revoked_at IS NULL
    RETURNING id, name
), inv AS (
    INSERT INTO machine_inventories (orchestrator_id, repositories, repository_keys, labels)
    SELECT o.id, %(repositories)s, %(repository_keys)s::text[], %(labels)s::text[] FROM o
    ON CONFLICT (orchestrator_id) DO UPDATE
    SET repositories = EXCLUDED.repositories, repository_keys = EXCLUDED.repository_keys,
        labels = EXCLUDED.labels, updated_at = now()
    RETURNING repositories, labels
)
SELECT o.id, o.name, inv.repositories, inv.labels FROM o, inv;

-- name: machine_inventory
-- What a machine said it has, its row locked until the caller's transaction ends (which then
-- changes it with `machine_describe`, so two changes never undo each other).
SELECT i.repositories, i.repository_keys, i.labels
FROM machine_inventories i JOIN orchestrators o ON o.id = i.orchestrator_id AND o.revoked_at IS NULL
WHERE i.orchestrator_id = %(id)s
FOR UPDATE OF i;
