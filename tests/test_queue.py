"""The dispatch core on a real Postgres: enqueue, claim, ack, release, sweep, cancel."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from shared.delivery import queue
from shared.delivery.models import DispatchPayload, Enqueued
from shared.delivery.queue import AckItem, ack, ack_many, claim, enqueue_dispatch, release, sweep
from shared.fleet.orchestrators import mark_listening
from shared.plumbing.db import Pool, connect, jsonb_once, statement, together, transaction
from shared.plumbing.settings import Settings
from tests.helpers.batches import unassign
from tests.helpers.data import MakeOrch, enqueue_one, issue, row_counts

# A fixed instant after every row the test enqueues (enqueue uses the database clock).
T0 = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


def counts(pool: Pool) -> tuple[int, int]:
    c = row_counts(pool)
    return c["sessions"], c["queue"]


def session_status(pool: Pool, sid: UUID) -> tuple[str, str | None]:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT status, failure_reason FROM dispatch_sessions WHERE id = %s", (sid,)
        ).fetchone()
    assert row is not None
    return row["status"], row["failure_reason"]


def test_enqueue_commits_session_and_row_together(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    sid, enq = enqueue_one(pool, o)
    assert counts(pool) == (1, 1)
    assert session_status(pool, sid) == ("queued", None)
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM dispatch_queue WHERE id = %s", (enq.queue_id,)).fetchone()
    assert row is not None and row["session_id"] == sid and row["message_id"] == enq.message_id


def test_exception_after_enqueue_leaves_neither_row(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    with pytest.raises(RuntimeError, match="boom"), transaction(pool) as tx:
        enqueue_dispatch(
            tx,
            org_id=o.org_id,
            orchestrator_id=o.id,
            linear_user_id=o.linear_user_id,
            message=DispatchPayload(issue=issue()),
        )
        raise RuntimeError("boom")
    assert counts(pool) == (0, 0)


@pytest.mark.parametrize("bad", ["connection", "pool", "none", "ended", "raw-transaction"])
def test_enqueue_refuses_anything_but_an_open_tx(
    bad: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    o = make_orchestrator()
    enqueue_one(pool, o)
    before = counts(pool)
    with connect(db_url) as conn:
        handle: object
        if bad == "connection":
            handle = conn
        elif bad == "pool":
            handle = pool
        elif bad == "none":
            handle = None
        elif bad == "raw-transaction":
            with conn.transaction() as raw:
                with pytest.raises(TypeError, match="needs an open transaction"):
                    enqueue_dispatch(
                        raw,  # type: ignore[arg-type]
                        org_id=o.org_id,
                        orchestrator_id=o.id,
                        linear_user_id=None,
                        message=DispatchPayload(issue=issue()),
                    )
            assert counts(pool) == before
            return
        else:
            with transaction(conn) as ended:
                pass
            handle = ended
        with pytest.raises(TypeError):
            enqueue_dispatch(
                handle,  # type: ignore[arg-type]
                org_id=o.org_id,
                orchestrator_id=o.id,
                linear_user_id=None,
                message=DispatchPayload(issue=issue()),
            )
    assert counts(pool) == before


def test_every_write_in_the_intake_transaction_refuses_a_connection(
    pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """Each function that writes in the caller's transaction refuses a plain connection before
    writing anything, and its error names it (so the caller knows which call was wrong)."""
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    calls: dict[str, Callable[[Any], object]] = {
        "enqueue_dispatch": lambda h: enqueue_dispatch(
            h,
            org_id=o.org_id,
            orchestrator_id=o.id,
            linear_user_id=None,
            message=DispatchPayload(issue=issue()),
        ),
        "change_issues": lambda h: queue.change_issues(
            h, [queue.IssueChange(o.org_id, issue().id, "k", "c", None, "x")]
        ),
        "route_and_enqueue": lambda h: queue.route_and_enqueue(
            h,
            org_id=o.org_id,
            linear_user_id=o.linear_user_id,
            message=DispatchPayload(issue=issue()),
            delivery_key="k",
            content_key="c",
        ),
    }
    with connect(db_url) as conn:
        for name, call in calls.items():
            with pytest.raises(TypeError, match=rf"^{name}\(\) needs an open transaction"):
                call(conn)
    assert counts(pool) == (1, 1)
    assert session_status(pool, sid) == ("queued", None)


# Queued sessions written directly without all their queue rows (enqueue_dispatch never does this):
# one alone, and three in one statement with rows for the first two only.
WITHOUT_ROWS = {
    "one": "INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, issue_id)"
    " VALUES (%(org)s, %(orch)s, 'queued', 'i')",
    "the_last_of_three": "WITH s AS (INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, issue_id)"
    " SELECT %(org)s, %(orch)s, 'queued', 'i' || g FROM generate_series(1, 3) g RETURNING id, issue_id)"
    " INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload)"
    " SELECT s.id, %(orch)s, %(org)s, '{}' FROM s WHERE s.issue_id <> 'i3'",
}


@pytest.mark.parametrize("written", sorted(WITHOUT_ROWS))
def test_a_session_without_its_queue_row_cannot_commit(
    pool: Pool, make_orchestrator: MakeOrch, written: str
) -> None:
    o = make_orchestrator()
    with (
        pytest.raises(
            psycopg.errors.IntegrityConstraintViolation, match=r"invariant violated: .* no queue row"
        ),
        transaction(pool) as tx,
    ):
        tx.execute(WITHOUT_ROWS[written], {"org": o.org_id, "orch": o.id})
    assert counts(pool) == (0, 0)


def test_a_delivered_session_cannot_keep_its_row(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    with pytest.raises(psycopg.errors.IntegrityConstraintViolation), transaction(pool) as tx:
        tx.execute("UPDATE dispatch_sessions SET status = 'delivered' WHERE id = %(id)s", {"id": sid})
    assert session_status(pool, sid)[0] == "queued"


# One statement over three queued sessions that leaves them all consistent, and the same statement
# breaking the invariant for the last one only: the commit is checked over every session written,
# by the trigger of the table whose write breaks it.
DELIVER = (
    "WITH gone AS (DELETE FROM dispatch_queue WHERE session_id = ANY(%(rows)s) RETURNING session_id)"
    " UPDATE dispatch_sessions SET status = 'delivered' WHERE id = ANY(%(sessions)s)"
)  # (a data-modifying CTE runs to completion whether or not the statement reads it)
BREAKS = {
    # every row deleted, the last session left `queued` (the queue's DELETE trigger sees it)
    "row_gone_session_queued": ("rows", "sessions"),
    # every session `delivered`, the last one's row kept (the sessions' UPDATE trigger sees it)
    "session_delivered_row_kept": ("sessions", "rows"),
}


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("how", sorted(BREAKS))
def test_a_commit_is_checked_over_every_session_it_wrote(
    pool: Pool, make_orchestrator: MakeOrch, how: str, broken: bool
) -> None:
    o = make_orchestrator()
    sids = [enqueue_one(pool, o, n)[0] for n in range(3)]
    every, fewer = BREAKS[how]
    params = {every: sids, fewer: sids[:2] if broken else sids}
    if broken:
        with (
            pytest.raises(psycopg.errors.IntegrityConstraintViolation, match=f"session {sids[2]} is"),
            transaction(pool) as tx,
        ):
            tx.execute(DELIVER, params)
        assert [session_status(pool, s)[0] for s in sids] == ["queued"] * 3
        assert counts(pool) == (3, 3)
    else:
        with transaction(pool) as tx:
            tx.execute(DELIVER, params)
        assert [session_status(pool, s)[0] for s in sids] == ["delivered"] * 3
        assert counts(pool) == (3, 0)


def test_claim_returns_due_rows_oldest_first_with_fresh_tokens(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    o, other = make_orchestrator(), make_orchestrator()
    ids = [enqueue_one(pool, o, n)[1].queue_id for n in range(5)]
    enqueue_one(pool, other, 99)
    got = claim(pool, o.id, max=3, lease_seconds=60)
    assert [m.queue_id for m in got] == ids[:3]
    assert all(m.attempt == 1 and m.orchestrator_id == o.id for m in got)
    assert len({m.claim_token for m in got}) == 3
    assert got[0].issue.identifier == "ENG-0"
    rest = claim(pool, o.id, max=10, lease_seconds=60)
    assert [m.queue_id for m in rest] == ids[3:]
    assert claim(pool, o.id, max=10, lease_seconds=60) == []


def test_the_library_claims_1_to_1000_at_a_time(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    enqueue_one(pool, o)
    for bad in (0, 1001):
        with pytest.raises(ValueError, match=r"^max must be between 1 and 1000$"):
            claim(pool, o.id, max=bad, lease_seconds=60)
    assert counts(pool) == (1, 1) and len(claim(pool, o.id, max=1000, lease_seconds=60)) == 1


def test_future_rows_are_not_due(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    with transaction(pool) as tx:
        enqueue_dispatch(
            tx,
            org_id=o.org_id,
            orchestrator_id=o.id,
            linear_user_id=None,
            message=DispatchPayload(issue=issue()),
            now=datetime.now(UTC) + timedelta(hours=1),
        )
    assert claim(pool, o.id, max=10, lease_seconds=60) == []
    assert len(claim(pool, o.id, max=10, lease_seconds=60, now=datetime.now(UTC) + timedelta(hours=2))) == 1


def test_message_id_is_stable_across_redeliveries(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    _, enq = enqueue_one(pool, o)
    first = claim(pool, o.id, max=1, lease_seconds=60, now=T0)[0]
    assert sweep(pool, Settings(), now=T0 + timedelta(seconds=61)).requeued == 1
    second = claim(pool, o.id, max=1, lease_seconds=60, now=T0 + timedelta(hours=1))[0]
    assert first.message_id == second.message_id == enq.message_id
    assert first.claim_token != second.claim_token
    assert (first.attempt, second.attempt) == (1, 2)


def test_backoff_table_with_the_defaults(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    enqueue_one(pool, o)
    settings = Settings(DEVPILOT_MAX_ATTEMPTS=10)
    now = T0
    delays = []
    for _ in range(6):
        [m] = claim(pool, o.id, max=1, lease_seconds=60, now=now)
        swept_at = now + timedelta(seconds=61)
        assert sweep(pool, settings, now=swept_at) == queue.SweepResult(1, 0)
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT available_at FROM dispatch_queue WHERE id = %s", (m.queue_id,)
            ).fetchone()
        assert row is not None
        delays.append(int((row["available_at"] - swept_at).total_seconds()))
        # not due before its backoff has passed
        assert (
            claim(pool, o.id, max=1, lease_seconds=60, now=row["available_at"] - timedelta(seconds=1)) == []
        )
        now = row["available_at"]
    assert delays == [60, 240, 540, 900, 900, 900]  # min(n² × 60 s, 15 min)


def test_dead_letter_at_the_attempt_limit(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    settings = Settings(DEVPILOT_MAX_ATTEMPTS=3)
    now = T0
    for n in range(1, 4):
        [m] = claim(pool, o.id, max=1, lease_seconds=60, now=now)
        assert m.attempt == n
        result = sweep(pool, settings, now=now + timedelta(seconds=61))
        now += timedelta(hours=1)
        assert result == (queue.SweepResult(1, 0) if n < 3 else queue.SweepResult(0, 1))
    assert counts(pool) == (1, 0)
    status, reason = session_status(pool, sid)
    assert status == "failed" and reason is not None and "3 delivery attempts" in reason
    # the latest token cannot resurrect a dead-lettered row
    assert ack(pool, o.id, m.queue_id, m.claim_token) == "not_found"


def test_sweep_leaves_live_leases_alone(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    enqueue_one(pool, o)
    claim(pool, o.id, max=1, lease_seconds=60, now=T0)
    assert sweep(pool, Settings(), now=T0 + timedelta(seconds=59)) == queue.SweepResult(0, 0)


def test_ack_fencing(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o, other = make_orchestrator(), make_orchestrator()
    sid, enq = enqueue_one(pool, o)
    assert ack(pool, o.id, enq.queue_id, uuid4()) == "claim_superseded"  # its own row, not this claim
    [a] = claim(pool, o.id, max=1, lease_seconds=60, now=T0)
    # a's lease expires and the row is re-queued; a is still the latest claim and may ack ...
    sweep(pool, Settings(), now=T0 + timedelta(seconds=61))
    # ... but first a newer claim takes it, so a is superseded
    [b] = claim(pool, o.id, max=1, lease_seconds=60, now=T0 + timedelta(hours=1))
    assert ack(pool, o.id, a.queue_id, a.claim_token) == "claim_superseded"
    assert ack(pool, other.id, b.queue_id, b.claim_token) == "not_found"
    assert ack(pool, o.id, uuid4(), b.claim_token) == "not_found"
    assert session_status(pool, sid)[0] == "queued"
    assert ack(pool, o.id, b.queue_id, b.claim_token) == "acked"
    assert session_status(pool, sid)[0] == "delivered"
    assert counts(pool) == (1, 0)
    assert ack(pool, o.id, b.queue_id, b.claim_token) == "acked"  # repeated ack
    assert ack(pool, o.id, a.queue_id, a.claim_token) == "claim_superseded"
    assert ack(pool, other.id, b.queue_id, b.claim_token) == "not_found"
    assert enq.queue_id == b.queue_id


def test_late_ack_after_requeue_still_delivers(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    [a] = claim(pool, o.id, max=1, lease_seconds=60, now=T0)
    assert sweep(pool, Settings(), now=T0 + timedelta(minutes=5)).requeued == 1
    assert ack(pool, o.id, a.queue_id, a.claim_token) == "acked"
    assert session_status(pool, sid)[0] == "delivered"


def test_batch_ack_judges_each_item(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    for n in range(3):
        enqueue_one(pool, o, n)
    m = claim(pool, o.id, max=3, lease_seconds=60)
    results = ack_many(
        pool,
        o.id,
        [
            AckItem(m[0].queue_id, m[0].claim_token),
            AckItem(m[1].queue_id, uuid4()),
            AckItem(uuid4(), m[2].claim_token),
            AckItem(m[0].queue_id, m[0].claim_token),
        ],
    ).statuses
    assert results == ["acked", "claim_superseded", "not_found", "acked"]
    assert counts(pool) == (3, 2)


def test_batch_ack_takes_only_uuids(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """The ids go to Postgres as one array's text: a string holding two ids must not ack two rows."""
    o = make_orchestrator()
    for n in range(2):
        enqueue_one(pool, o, n)
    a, b = claim(pool, o.id, max=2, lease_seconds=60)
    ids, tokens = f"{a.queue_id},{b.queue_id}", f"{a.claim_token},{b.claim_token}"
    bad = [AckItem(ids, a.claim_token), AckItem(a.queue_id, tokens)]  # type: ignore[arg-type]
    for item in bad:
        with pytest.raises(TypeError, match="not a UUID: str"):
            ack_many(pool, o.id, [item])
    assert counts(pool) == (2, 2)
    assert ack_many(pool, o.id, [AckItem(a.queue_id, a.claim_token)]).statuses == ["acked"]


def test_release_counts_as_a_failed_attempt(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    settings = Settings(DEVPILOT_MAX_ATTEMPTS=2)
    [a] = claim(pool, o.id, max=1, lease_seconds=60, now=T0)
    r = release(pool, settings, o.id, a.queue_id, a.claim_token, reason="disk full", now=T0)
    assert r.status == "released" and r.available_at == T0 + timedelta(seconds=60)
    again = release(pool, settings, o.id, a.queue_id, a.claim_token, now=T0)  # said again, same time
    assert again.status == "released" and again.available_at == T0 + timedelta(seconds=60)
    assert release(pool, settings, o.id, a.queue_id, uuid4(), now=T0).status == "claim_superseded"
    assert release(pool, settings, o.id, uuid4(), a.claim_token, now=T0).status == "not_found"
    [b] = claim(pool, o.id, max=1, lease_seconds=60, now=T0 + timedelta(seconds=60))
    assert release(pool, settings, o.id, a.queue_id, a.claim_token, now=T0).status == "claim_superseded"
    r = release(pool, settings, o.id, b.queue_id, b.claim_token, reason="gave up", now=T0)
    assert r.status == "released" and r.dead_lettered and r.available_at is None
    status, reason = session_status(pool, sid)
    assert status == "failed" and reason is not None and "gave up" in reason
    assert counts(pool) == (1, 0)


def test_release_after_the_ack_changes_nothing(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    [a] = claim(pool, o.id, max=1, lease_seconds=60, now=T0)
    assert ack(pool, o.id, a.queue_id, a.claim_token) == "acked"
    assert release(pool, Settings(), o.id, a.queue_id, a.claim_token, now=T0).status == "claim_superseded"
    assert session_status(pool, sid) == ("delivered", None)


@pytest.mark.parametrize("limit", [1, 5], ids=["dead-lettered", "requeued"])
def test_the_sweep_goes_through_every_batch(
    pool: Pool, make_orchestrator: MakeOrch, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """More expired claims than one batch: every one is swept, each counted once; 21 = three full
    batches of 7 and an empty one, 20 = two full and a short one."""
    monkeypatch.setattr(queue, "SWEEP_BATCH", 7)
    for n, rows in enumerate((21, 20)):
        o = make_orchestrator()
        for i in range(rows):
            enqueue_one(pool, o, n=i)
        at = T0 + timedelta(days=n)
        assert len(claim(pool, o.id, max=100, lease_seconds=60, now=at)) == rows
        r = sweep(pool, Settings(DEVPILOT_MAX_ATTEMPTS=limit), now=at + timedelta(seconds=61))
        assert (r.requeued, r.dead_lettered) == ((0, rows) if limit == 1 else (rows, 0))
        with pool.connection() as conn:
            left = conn.execute(
                "SELECT count(*) AS n FROM dispatch_queue WHERE orchestrator_id = %s AND lease_expires_at IS NOT NULL",
                (o.id,),
            ).fetchone()
        assert left is not None and left["n"] == 0


def test_rerouting_goes_through_every_batch(
    pool: Pool, make_orchestrator: MakeOrch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue, "SWEEP_BATCH", 7)
    quiet = make_orchestrator(linear_user_id="u-batch", name="laptop")
    for i in range(21):
        enqueue_one(pool, quiet, n=i)
    live = make_orchestrator(linear_user_id="u-batch", name="desktop")
    with pool.connection() as conn:
        conn.execute(
            "UPDATE orchestrators SET last_seen_at = now() - interval '1 hour' WHERE id = %s", (quiet.id,)
        )
        conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (live.id,))
    assert sweep(pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)).rerouted == 21
    with pool.connection() as conn:
        held = conn.execute(
            "SELECT orchestrator_id, count(*) AS n FROM dispatch_queue GROUP BY orchestrator_id"
        ).fetchall()
    assert [(r["orchestrator_id"], r["n"]) for r in held] == [(live.id, 21)]


def test_an_unassignment_cancels_its_issues_dispatch_queued_or_claimed(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    o = make_orchestrator()
    sid1, _ = enqueue_one(pool, o, 1)
    sid2, _ = enqueue_one(pool, o, 2)
    [m] = claim(pool, o.id, max=1, lease_seconds=60)
    assert m.session_id == sid1
    assert unassign(pool, o.org_id, issue(1).id) == {"status": "cancelled", "sessionId": str(sid1)}
    assert session_status(pool, sid1)[0] == "cancelled"
    assert ack(pool, o.id, m.queue_id, m.claim_token) == "not_found"
    assert session_status(pool, sid2)[0] == "queued"
    # another org's issue with the same id is untouched
    assert unassign(pool, "org-b", issue(2).id) == {"status": "ignored", "reason": "nothing_to_cancel"}
    assert session_status(pool, sid2)[0] == "queued"


def test_notification_is_sent_only_on_commit(pool: Pool, db_url: str, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    mark_listening(pool, o.id, 30, 0)  # (a long-poll of this machine is waiting)
    with connect(db_url) as listener:
        listener.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
        with pytest.raises(RuntimeError), transaction(pool) as tx:
            enqueue_dispatch(
                tx,
                org_id=o.org_id,
                orchestrator_id=o.id,
                linear_user_id=None,
                message=DispatchPayload(issue=issue()),
            )
            raise RuntimeError("rolled back")
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []
        enqueue_one(pool, o)
        got = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in got] == [str(o.id)]


def test_an_enqueue_notifies_only_a_machine_that_is_long_polling(
    pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """A NOTIFY makes Postgres serialise commits, so an enqueue sends one only while a long-poll of
    its machine is waiting (marked): not before, not to another machine, not after the wait ends."""
    waiting, idle = make_orchestrator(linear_user_id="u-wait"), make_orchestrator(linear_user_id="u-idle")
    with connect(db_url) as listener:
        listener.execute(f"LISTEN {queue.NOTIFY_CHANNEL}")
        enqueue_one(pool, waiting, 1)
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # nobody is waiting yet
        mark_listening(pool, waiting.id, 1, 0)
        enqueue_one(pool, idle, 2)
        enqueue_one(pool, waiting, 3)
        got = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.payload for n in got] == [str(waiting.id)]
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # (and none for `idle`)
        time.sleep(1.2)  # the long-poll's wait (1 s, no margin) is over
        enqueue_one(pool, waiting, 4)
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []


@pytest.mark.parametrize(
    "wrong", ["session-in-use", "delivered-session", "unknown-machine", "revoked-machine"]
)
def test_enqueue_refuses_a_session_id_in_use_or_a_machine_that_is_not_active(
    pool: Pool, make_orchestrator: MakeOrch, wrong: str
) -> None:
    """A session is created by its enqueue and never reused: a session id that exists already
    (queued or delivered), or a machine that does not exist or is revoked (which could never claim
    it), aborts the transaction with nothing new and leaves the existing session as it was."""
    o = make_orchestrator()
    sid, _ = enqueue_one(pool, o)
    if wrong == "delivered-session":
        [m] = claim(pool, o.id, max=1, lease_seconds=60)
        assert ack(pool, o.id, m.queue_id, m.claim_token) == "acked"
    target = o.id
    if wrong == "unknown-machine":
        target = uuid4()
    elif wrong == "revoked-machine":
        target = make_orchestrator().id
        with pool.connection() as conn:
            conn.execute("UPDATE orchestrators SET revoked_at = now() WHERE id = %s", (target,))
    status = session_status(pool, sid)
    before = counts(pool)
    reused = wrong in ("session-in-use", "delivered-session")
    refused = psycopg.errors.IntegrityError if reused else queue.MachineRevoked
    with pytest.raises(refused), transaction(pool) as tx:
        enqueue_dispatch(
            tx,
            org_id=o.org_id,
            orchestrator_id=target,
            linear_user_id=None,
            message=DispatchPayload(issue=issue(7)),
            session_id=sid if reused else uuid4(),
        )
    assert counts(pool) == before
    assert session_status(pool, sid) == status


def test_enqueue_refuses_a_message_that_is_not_a_dispatch_payload(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """A plain dict (say, a webhook body passed straight through) is refused before anything is
    written: the message a machine gets always has the shape of the contract."""
    o = make_orchestrator()
    with (
        pytest.raises(TypeError, match=r"^enqueue_dispatch\(\) message must be a DispatchPayload$"),
        transaction(pool) as tx,
    ):
        enqueue_dispatch(
            tx,
            org_id=o.org_id,
            orchestrator_id=o.id,
            linear_user_id=None,
            message={"issue": {"id": "x", "identifier": "X-1"}},  # type: ignore[arg-type]
        )
    assert counts(pool) == (0, 0)


@pytest.mark.parametrize(
    "message, delivery_key",
    [
        (DispatchPayload(issue=issue(1), agent_session_id="as-1"), None),  # no webhook delivery
        (DispatchPayload(issue=issue(1)), "delivery-1"),  # no agent session
        (DispatchPayload(issue=issue(1), agent_session_id="as-1", kind="prompt"), "delivery-1"),
    ],
)
def test_enqueue_writes_the_queued_notice_only_for_an_agent_sessions_start_answering_a_webhook(
    pool: Pool, make_orchestrator: MakeOrch, message: DispatchPayload, delivery_key: str | None
) -> None:
    """Linear's "Queued for <machine>" is the first activity of a new agent session, written by the
    intake's enqueue. Asked for anything else, the enqueue refuses before writing a thing."""
    o = make_orchestrator()
    with (
        pytest.raises(ValueError, match="notice_queued is for an agent session's start"),
        transaction(pool) as tx,
    ):
        enqueue_dispatch(
            tx,
            org_id=o.org_id,
            orchestrator_id=o.id,
            linear_user_id=None,
            message=message,
            delivery_key=delivery_key,
            notice_queued=True,
        )
    assert counts(pool) == (0, 0)


def test_batch_ack_with_one_row_twice(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    enqueue_one(pool, o)
    [m] = claim(pool, o.id, max=1, lease_seconds=60)
    results = ack_many(
        pool,
        o.id,
        [
            AckItem(m.queue_id, uuid4()),
            AckItem(m.queue_id, m.claim_token),
            AckItem(m.queue_id, m.claim_token),
        ],
    ).statuses
    assert results == ["claim_superseded", "acked", "acked"]


def test_a_one_statement_transaction_commits_its_statement_and_refuses_a_second(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """`statement()`: the statement is the transaction, committed when it ends (no BEGIN, no
    COMMIT), all of it or none of it. The handle refuses a second statement, so writes that must
    commit together cannot be split over two by mistake."""
    o = make_orchestrator()

    def enqueue(tx: Any, sid: UUID | None = None) -> Enqueued:
        message = DispatchPayload(issue=issue())
        return enqueue_dispatch(
            tx, org_id=o.org_id, orchestrator_id=o.id, linear_user_id=None, message=message, session_id=sid
        )

    with statement(pool) as tx:
        first = enqueue(tx)
        assert counts(pool) == (1, 1)  # committed: another connection sees both rows already
        with pytest.raises(TypeError, match="one statement"):
            enqueue(tx)
    with pytest.raises(TypeError, match="has ended"):
        enqueue(tx)  # nor after its block
    assert counts(pool) == (1, 1)
    with statement(pool) as tx, pytest.raises(psycopg.errors.UniqueViolation):
        enqueue(tx, first.session_id)  # a statement that fails writes nothing
    assert counts(pool) == (1, 1)
    with transaction(pool) as tx:  # and leaves its connection with no transaction open
        assert tx.one("SELECT 1 AS one") == {"one": 1}


def test_statements_sent_together_are_one_transaction_block_all_or_nothing(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """`together()`: its statements are one transaction block (BEGIN goes with the first, COMMIT
    with the last, neither a statement of its own): a savepoint can be taken in it, nothing is seen
    by another connection before its end, and a statement that fails writes none of it. A `jsonb`
    parameter several of its statements are sent (`jsonb_once`) is the same value in each."""
    o = make_orchestrator()
    message = DispatchPayload(issue=issue())

    enqueue = partial(
        enqueue_dispatch, org_id=o.org_id, orchestrator_id=o.id, linear_user_id=None, message=message
    )

    with together(pool) as tx:
        first = enqueue(tx)
        tx.execute("SAVEPOINT inside")  # (refused outside a transaction block)
        batch = jsonb_once([{"n": 1, "text": "é"}])
        same = [tx.execute("SELECT %(b)s::jsonb AS b", {"b": batch}) for _ in range(2)]
        assert counts(pool) == (0, 0)  # not committed yet
    assert counts(pool) == (1, 1)
    assert [c.fetchone() for c in same] == [{"b": [{"n": 1, "text": "é"}]}] * 2
    with pytest.raises(psycopg.errors.UniqueViolation), together(pool) as tx:
        enqueue(tx)
        enqueue(tx, session_id=first.session_id)
    assert counts(pool) == (1, 1)  # the first of the two rolled back with the second
    with together(pool) as tx:  # and its connection was left with no transaction open
        row = tx.execute("SELECT 1 AS one")
    assert row.fetchone() == {"one": 1}


def test_transaction_pooler_mode_sets_the_timeout_per_transaction(db_url: str) -> None:
    from shared.plumbing.db import open_pool

    settings = Settings(DEVPILOT_TRANSACTION_POOLER=True, DEVPILOT_STATEMENT_TIMEOUT_MS=1234)
    with open_pool(db_url, settings, max_size=1) as p:
        with transaction(p) as tx:
            row = tx.one("SHOW statement_timeout")
            assert row is not None and row["statement_timeout"] == "1234ms"
        with statement(p) as tx:  # a one-statement transaction too: BEGIN, SET LOCAL, it, COMMIT
            row = tx.one("SELECT current_setting('statement_timeout') AS t, current_setting('jit') AS jit")
            assert row == {"t": "1234ms", "jit": "off"}  # (the outbox's take runs so: take_in_rounds)
        with p.connection() as conn:
            assert conn.prepare_threshold is None  # no server-side prepared statements
            row = conn.execute("SHOW statement_timeout").fetchone()
            assert row is not None and row["statement_timeout"] == "0"  # nothing stuck to the session
    with (
        open_pool(db_url, Settings(DEVPILOT_STATEMENT_TIMEOUT_MS=4321), max_size=1) as p,
        p.connection() as conn,
    ):
        row = conn.execute("SHOW statement_timeout").fetchone()
        assert row is not None and row["statement_timeout"] == "4321ms"


def test_behind_a_pooler_the_outbox_take_keeps_the_lock_limit(db_url: str) -> None:
    """Behind a transaction pooler no session setting sticks, so each round of the outbox's take is
    a transaction that sets the server-side limits (and no JIT) first: a take that meets a lock on
    the outbox gives up at the lock limit (LockNotAvailable), where one sent on its own would hold
    its connection until the deadline cut it (OperationalError)."""
    from shared.linear import notices
    from shared.plumbing import deadline
    from shared.plumbing.db import open_pool

    settings = Settings(DEVPILOT_TRANSACTION_POOLER=True, DEVPILOT_LOCK_TIMEOUT_MS=200)
    with open_pool(db_url, settings, max_size=2) as p, connect(db_url) as holder:
        with holder.transaction():
            holder.execute("LOCK TABLE linear_notices IN ACCESS EXCLUSIVE MODE")
            for ids in (None, [uuid4()]):  # the sweep's round, and the send after a commit
                with deadline.bound(5), pytest.raises(psycopg.errors.LockNotAvailable):
                    notices.send_pending(p, settings, ids=ids)


def _others(pool: Pool, sids: list[UUID]) -> list[tuple[str, int]]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT s.status, coalesce(q.attempts, -1) AS attempts FROM dispatch_sessions s"
            " LEFT JOIN dispatch_queue q ON q.session_id = s.id WHERE s.id = ANY(%s) ORDER BY s.created_at",
            (sids,),
        ).fetchall()
    return [(r["status"], r["attempts"]) for r in rows]


@pytest.mark.parametrize("ended_by", ["sweep", "release"])
def test_a_dead_letter_fails_its_own_session_and_no_other(
    pool: Pool, make_orchestrator: MakeOrch, ended_by: str
) -> None:
    """At the attempt limit one row is dropped and one session failed: every other session — the
    same machine's, another machine's, another org's, queued or claimed — keeps its row and state."""
    o, p, q = make_orchestrator(), make_orchestrator(), make_orchestrator(org_id="org-b")
    doomed, _ = enqueue_one(pool, o, 1)
    others = [enqueue_one(pool, o, 2)[0], enqueue_one(pool, p, 3)[0], enqueue_one(pool, q, 4)[0]]
    [held] = claim(pool, p.id, max=1, lease_seconds=3600, now=T0)  # one other row claimed, live lease
    settings = Settings(DEVPILOT_MAX_ATTEMPTS=1)
    [m] = [x for x in claim(pool, o.id, max=10, lease_seconds=60, now=T0) if x.session_id == doomed]
    before = _others(pool, others)
    if ended_by == "sweep":
        with pool.connection() as conn:  # only the doomed row's lease has run out
            conn.execute(
                "UPDATE dispatch_queue SET lease_expires_at = lease_expires_at + interval '1 day'"
                " WHERE session_id <> %s AND lease_expires_at IS NOT NULL",
                (doomed,),
            )
        assert sweep(pool, settings, now=T0 + timedelta(seconds=61)) == queue.SweepResult(0, 1)
    else:
        assert release(
            pool, settings, o.id, m.queue_id, m.claim_token, reason="gave up", now=T0
        ).dead_lettered
    assert session_status(pool, doomed)[0] == "failed"
    assert _others(pool, others) == before  # untouched: same states, rows still there, same attempts
    assert all(status == "queued" and attempts >= 0 for status, attempts in before)
    assert ack(pool, p.id, held.queue_id, held.claim_token) == "acked"


def test_a_lease_ends_exactly_lease_seconds_after_the_claim(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """DEVPILOT_LEASE_SECONDS: "how long a claim holds a row before the sweep may re-queue it" — held
    for all of it, free from its last instant on."""
    o = make_orchestrator()
    enqueue_one(pool, o)
    claim(pool, o.id, max=1, lease_seconds=60, now=T0)
    assert sweep(pool, Settings(), now=T0 + timedelta(seconds=60, microseconds=-1)) == queue.SweepResult(0, 0)
    assert sweep(pool, Settings(), now=T0 + timedelta(seconds=60)) == queue.SweepResult(1, 0)
