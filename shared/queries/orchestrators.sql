-- The registry of machines that take work, and their bearer tokens (stored as SHA-256 only).

-- name: orchestrator_insert
INSERT INTO orchestrators (org_id, linear_user_id, name, token_hash)
VALUES (%(org_id)s, %(linear_user_id)s, %(name)s, %(token_hash)s)
RETURNING id;

-- name: orchestrator_by_token
-- Who is calling, and that it was seen, in one statement (the `caller` fragment).
WITH
-- include: caller
SELECT id, org_id, linear_user_id, name FROM who;

-- name: orchestrator_by_token_read
-- Who is calling, read only: a person looking at their machine (`whoami`, `machines`, `logout`
-- through /me) is not the machine asking for work, and must not make it the one routing prefers.
SELECT id, org_id, linear_user_id, name FROM orchestrators
WHERE token_hash = %(token_hash)s AND revoked_at IS NULL;

-- name: caller
-- A fragment: the CTEs `who` (the active machine holding this token hash: one row or none) and
-- `seen`, which records it was seen. A revoked token authenticates nothing, from its next request on.
-- Seen means its orchestrator called: a claim, a long-poll, an ack or release, the Realtime token,
-- `/machine`, its activities; never /me (`orchestrator_by_token_read`).
-- Last-seen (routing prefers the most recently seen machine; the sweep reroutes from a quiet one) is
-- written at most once a second per machine, so idle polls and concurrent calls cost a read, not a
-- row update. It never waits for the machine's row (SKIP LOCKED): whoever holds it is a concurrent
-- caller already writing last-seen, or a revoke — which then deletes this machine's queue rows, and
-- a poll that had claimed one and waited here for the row would deadlock with it.
who AS (
    SELECT id, org_id, linear_user_id, name FROM orchestrators
    WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
), seen AS (
    UPDATE orchestrators o SET last_seen_at = now()
    WHERE o.id = (
        SELECT s.id FROM orchestrators s JOIN who ON who.id = s.id
        WHERE s.last_seen_at IS NULL OR s.last_seen_at < now() - interval '1 second'
        FOR UPDATE OF s SKIP LOCKED
    )
    RETURNING o.id
)

-- name: orchestrator_list
SELECT o.id, o.org_id, o.linear_user_id, o.name, o.created_at, o.last_seen_at, o.revoked_at,
       coalesce(i.repositories, '[]') AS repositories, coalesce(i.labels, '{}') AS labels
FROM orchestrators o LEFT JOIN machine_inventories i ON i.orchestrator_id = o.id
ORDER BY o.created_at, o.id;

-- name: orchestrator_revoke
-- Idempotent: revoking twice keeps the first revocation time. The NOTIFY (sent on commit) wakes a
-- long-poll of this machine that is already waiting, so it ends instead of returning work.
-- FOR UPDATE, not the UPDATE's own weaker lock: it waits for every enqueue to this machine that
-- holds its row (FOR KEY SHARE, see `enqueue` in queue.sql) to commit, so the revoke's next
-- statements, which look at the machine's rows after this one, see that work and move or cancel
-- it; and an enqueue that comes later waits for the revoke and finds the machine revoked.
-- First, revokes of one user's machines take turns (a transaction-scoped advisory lock on the
-- org and user): the starts a revoke moves go to another of the user's machines, which must not
-- be being revoked meanwhile, and two revokes that each moved work to the other's machine would
-- each wait for the other's row (a deadlock). Only the own row is locked, so a revoke never waits
-- on (or deadlocks with) the sweep's reroute between the user's other machines.
WITH serial AS (
    SELECT pg_advisory_xact_lock(hashtextextended('revoke/' || org_id || '/' || linear_user_id, 0))
    FROM orchestrators WHERE id = %(id)s
), locked AS (
    SELECT id FROM orchestrators
    WHERE id = %(id)s AND (SELECT count(*) FROM serial) > 0  -- (the turn first, then the row)
    FOR UPDATE
)
UPDATE orchestrators o SET revoked_at = coalesce(o.revoked_at, now())
FROM locked WHERE o.id = locked.id
RETURNING o.id, o.revoked_at, pg_notify('devpilot_dispatch', o.id::text) AS woken;

-- name: orchestrator_org
SELECT org_id FROM orchestrators WHERE id = %(id)s;

-- name: orchestrator_active
-- The machine is active, and (with `token_hash`) still holds that token: a long-poll authenticated
-- before a revoke, or before the machine's owner logged in again (a new token), ends.
SELECT id FROM orchestrators
WHERE id = %(id)s AND revoked_at IS NULL AND (%(token_hash)s::bytea IS NULL OR token_hash = %(token_hash)s);

-- name: mark_listening
-- A long-poll, before its first look at the table: enqueues to this machine NOTIFY until the end of
-- its wait (with a margin). Its own transaction, committed before that look. FOR UPDATE waits for
-- every enqueue holding the machine's row FOR KEY SHARE (see `enqueue`), so an enqueue that read
-- "not listening" has committed before the look begins. Written only when the window does not
-- already cover this wait, so overlapping long-polls of one machine cost a read; an enqueue then
-- finds the covering window already committed and notifies.
WITH mine AS (
    SELECT id FROM orchestrators
    WHERE id = %(id)s
      AND (listening_until IS NULL OR listening_until < now() + make_interval(secs => %(seconds)s))
    FOR UPDATE
)
UPDATE orchestrators o SET listening_until = now() + make_interval(secs => %(seconds)s + %(margin)s)
FROM mine WHERE o.id = mine.id;

-- name: orchestrator_by_id
-- For an agent token: the active machine it names, with the hash its mac is keyed with.
SELECT id, org_id, linear_user_id, name, token_hash FROM orchestrators
WHERE id = %(id)s AND revoked_at IS NULL;

-- name: revoked_with_work
-- The sweep's backstop: revoked machines that still have queue rows. A revoke moves or cancels
-- everything it can see, and an enqueue to a machine being revoked waits for it and writes nothing
-- (see `orchestrator_revoke`); but the sweep's own reroute can move work to a machine whose revoke
-- is committing, and a database written by a version without those locks can hold such rows. The
-- sweep revokes these machines again (idempotent), which moves or cancels the rows.
SELECT o.id FROM orchestrators o
WHERE o.revoked_at IS NOT NULL AND EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.orchestrator_id = o.id)
ORDER BY o.id
LIMIT %(batch)s;

-- name: enroll_turn
-- In an enrollment's redeem (`shared.fleet.enroll`, through `orchestrators.enroll`): enrollments of one
-- machine name by one person take turns (a transaction-scoped lock), so two at once replace one machine's token twice instead of registering the name twice. Its own statement,
-- before `orchestrator_enroll`, whose snapshot then sees what the other committed.
SELECT pg_advisory_xact_lock(hashtextextended('enroll/' || %(org_id)s || '/' || %(linear_user_id)s || '/' || %(name)s, 0));

-- name: orchestrator_enroll
-- The person's active machine of that name gets the new token (the old one stops at once; its id,
-- and so its queued work, stay), or a new machine is registered under that name.
WITH existing AS (
    SELECT id FROM orchestrators
    WHERE org_id = %(org_id)s AND linear_user_id = %(linear_user_id)s AND name = %(name)s AND revoked_at IS NULL
    ORDER BY created_at DESC, id
    LIMIT 1
    FOR UPDATE
), replaced AS (
    UPDATE orchestrators o SET token_hash = %(token_hash)s FROM existing e WHERE o.id = e.id RETURNING o.id
), added AS (
    INSERT INTO orchestrators (org_id, linear_user_id, name, token_hash)
    SELECT %(org_id)s, %(linear_user_id)s, %(name)s, %(token_hash)s WHERE NOT EXISTS (SELECT 1 FROM existing)
    RETURNING id
)
SELECT id, true AS replaced FROM replaced UNION ALL SELECT id, false FROM added;
