"""Issues that arrive together are written together (shared/batching.py, `route_and_enqueue_many`):
each answer is what it would be alone, one bad webhook fails only itself, and nothing is answered
before its rows commit. Real Postgres, real HTTP into the real app."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from shared import intake
from shared.db import Pool, connect, statement
from shared.models import DispatchPayload
from shared.queue import NO_MACHINE, Routed, Start, route_and_enqueue_many
from tests.helpers.api import Api, issue_event
from tests.helpers.data import MakeOrch, issue, row_counts


def start(user: str, n: int, *, delivery: str | None = None, org: str = "org-a") -> Start:
    key = delivery or f"d-{uuid.uuid4()}"
    return Start(org, user, DispatchPayload(issue=issue(n, org)), key, f"c-{key}")


def deliveries(pool: Pool) -> dict[str, tuple[str, Any]]:
    with pool.connection() as conn:
        got = conn.execute("SELECT delivery_key, outcome, session_id FROM webhook_deliveries").fetchall()
    return {r["delivery_key"]: (r["outcome"], r["session_id"]) for r in got}


def test_each_element_of_a_batch_is_answered_as_it_would_be_alone(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    mine = make_orchestrator(linear_user_id="has-machine")
    make_orchestrator(org_id="org-b", linear_user_id="has-machine")  # (the same user id, another org)
    seen = start("has-machine", 9, delivery="seen-before")
    first = intake._one_statement(pool, seen)  # (the one statement of a start alone)
    assert isinstance(first, Routed)
    batch = [start("has-machine", 1), start("nobody", 2), seen, start("has-machine", 3)]
    with statement(pool) as tx:
        out = route_and_enqueue_many(tx, batch)
    assert isinstance(out[0], Routed) and isinstance(out[3], Routed)
    assert out[1] == NO_MACHINE and out[2] is None
    assert out[0].orchestrator_id == out[3].orchestrator_id == mine.id
    assert out[0].enqueued.session_id != out[3].enqueued.session_id
    recorded = deliveries(pool)
    assert recorded[batch[0].delivery_key] == ("dispatched", out[0].enqueued.session_id)
    assert recorded[batch[1].delivery_key] == ("ignored", None)
    assert recorded[batch[3].delivery_key] == ("dispatched", out[3].enqueued.session_id)
    assert recorded["seen-before"] == ("dispatched", first.enqueued.session_id)  # untouched
    with pool.connection() as conn:
        queued = conn.execute(
            "SELECT q.id, q.session_id, q.message_id, q.orchestrator_id, q.payload, s.status, s.issue_id,"
            " s.org_id FROM dispatch_queue q JOIN dispatch_sessions s ON s.id = q.session_id"
            " WHERE s.id = ANY(%s)",
            ([out[0].enqueued.session_id, out[3].enqueued.session_id],),
        ).fetchall()
    by_session = {r["session_id"]: r for r in queued}
    for i in (0, 3):
        routed = out[i]
        assert isinstance(routed, Routed)
        row = by_session[routed.enqueued.session_id]
        assert row["id"] == routed.enqueued.queue_id and row["message_id"] == routed.enqueued.message_id
        assert row["status"] == "queued" and row["org_id"] == "org-a"
        assert row["issue_id"] == batch[i].message.issue.id
        assert row["payload"]["issue"]["id"] == batch[i].message.issue.id
    assert row_counts(pool)["sessions"] == 3 and row_counts(pool)["queue"] == 3


def test_a_batch_needs_a_transaction_and_writes_a_copy_once(pool: Pool, make_orchestrator: MakeOrch) -> None:
    make_orchestrator(linear_user_id="u")
    with pool.connection() as conn, pytest.raises(TypeError, match="open transaction"):
        route_and_enqueue_many(conn, [start("u", 1)])  # type: ignore[arg-type]
    assert row_counts(pool)["sessions"] == 0 and deliveries(pool) == {}
    twice, other = start("u", 1), start("u", 2)
    same_content = Start("org-a", "u", twice.message, "d-another-id", twice.content_key)
    with statement(pool) as tx:
        out = route_and_enqueue_many(tx, [twice, other, twice, same_content])
    assert isinstance(out[0], Routed) and isinstance(out[1], Routed)
    assert out[2] is None and out[3] is None  # (copies: as a delivery seen before)
    assert row_counts(pool)["sessions"] == 2 and len(deliveries(pool)) == 2


def _lock_machine(db_url: str, oid: str) -> psycopg.Connection[Any]:
    """Holds the machine's row FOR UPDATE, so a statement that takes it FOR KEY SHARE waits."""
    conn = psycopg.connect(db_url)
    conn.execute("SELECT 1 FROM orchestrators WHERE id = %s FOR UPDATE", (oid,))
    return conn


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _pile_up(
    api: Api, db_url: str, oid: str, bodies: list[tuple[dict[str, Any], str]]
) -> list[httpx.Response]:
    """The first webhook leads and waits on the machine's lock; the others arrive meanwhile and
    wait in line for the next batch; then the lock is let go."""
    locker = _lock_machine(db_url, oid)
    combiner = intake._issue_starts(api.pool)
    try:
        with ThreadPoolExecutor(len(bodies)) as ex:
            futures: list[Future[httpx.Response]] = [ex.submit(api.webhook, *bodies[0])]
            with connect(db_url) as watch:
                _wait_for(
                    lambda: watch.execute("SELECT count(*) AS n FROM pg_locks WHERE NOT granted").fetchone()[
                        "n"
                    ],  # type: ignore[index]
                    "the first webhook to wait on the lock",
                )
            futures += [ex.submit(api.webhook, *b) for b in bodies[1:]]
            _wait_for(lambda: len(combiner._waiting) == len(bodies) - 1, "the others to wait in line")
            locker.commit()
            return [f.result(30) for f in futures]
    finally:
        locker.close()


def test_webhooks_that_arrive_together_commit_together_each_answered_as_alone(api: Api, db_url: str) -> None:
    oid, _ = api.register(user="user-1")
    bodies = [(issue_event(issue_id=f"iss-{i}"), f"d-{i}") for i in range(21)]
    answers = _pile_up(api, db_url, oid, bodies)
    assert [a.status_code for a in answers] == [200] * 21
    assert {a.json()["status"] for a in answers} == {"dispatched"}
    assert len({a.json()["sessionId"] for a in answers}) == 21
    assert row_counts(api.pool)["sessions"] == 21 and row_counts(api.pool)["queue"] == 21
    with api.pool.connection() as conn:
        commits = conn.execute(
            "SELECT created_at, count(*) AS n FROM dispatch_sessions GROUP BY created_at ORDER BY n"
        ).fetchall()
    # The first alone, then the twenty that waited in one statement: one transaction, one now().
    assert [r["n"] for r in commits] == [1, 20]
    for body, delivery in bodies:  # each retry is a duplicate of its own session
        again = api.webhook(body, delivery).json()
        assert again["status"] == "duplicate"
    sessions = {a.json()["sessionId"] for a in answers}
    assert {api.webhook(b, d).json()["sessionId"] for b, d in bodies} == sessions


def test_copies_of_one_delivery_in_a_batch_make_one_session(api: Api, db_url: str) -> None:
    oid, _ = api.register(user="user-1")
    copy = (issue_event(issue_id="iss-copied"), "d-copied")
    bodies = [(issue_event(issue_id=f"iss-{i}"), f"d-{i}") for i in range(8)] + [copy] * 4
    answers = [a.json() for a in _pile_up(api, db_url, oid, bodies)]
    copies = answers[8:]
    assert sorted(a["status"] for a in copies) == ["dispatched", "duplicate", "duplicate", "duplicate"]
    assert len({a["sessionId"] for a in copies}) == 1
    assert all(a["status"] == "dispatched" for a in answers[:8])
    assert row_counts(api.pool)["sessions"] == 9 and row_counts(api.pool)["queue"] == 9


REFUSE_ONE = """
CREATE FUNCTION refuse_bad_issue() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.issue_id = 'iss-bad' THEN
        RAISE EXCEPTION 'refused' USING ERRCODE = '22023';  -- a data exception: 400
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_bad_issue BEFORE INSERT ON dispatch_sessions
    FOR EACH ROW EXECUTE FUNCTION refuse_bad_issue();
"""


def test_a_webhook_postgres_refuses_fails_alone_and_its_batch_is_written_without_it(
    api: Api, db_url: str
) -> None:
    oid, _ = api.register(user="user-1")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(REFUSE_ONE)  # (this test's database only)
    bodies = [(issue_event(issue_id=f"iss-{i}"), f"d-{i}") for i in range(6)]
    bodies.insert(3, (issue_event(issue_id="iss-bad"), "d-bad"))
    answers = _pile_up(api, db_url, oid, bodies)
    assert answers[3].status_code == 400 and answers[3].json()["error"] == "bad_request"
    good = answers[:3] + answers[4:]
    assert [a.json()["status"] for a in good] == ["dispatched"] * 6
    assert row_counts(api.pool)["sessions"] == 6 and row_counts(api.pool)["queue"] == 6
    assert "d-bad" not in deliveries(api.pool) and len(deliveries(api.pool)) == 6


def test_a_revoke_committed_while_a_batch_waits_leaves_nothing_on_the_revoked_machine(
    api: Api, db_url: str
) -> None:
    """The batch locks each machine as the one statement does: a revoke that commits while the
    batch waits for the machine's row is seen, nothing is written for that machine, and each
    webhook is decided again (here: the user's other machine), once."""
    other, _ = api.register(user="user-1", name="desktop")
    first, _ = api.register(user="user-1", name="laptop")  # (the newer: routing's choice)
    elsewhere, _ = api.register(user="user-2", name="elsewhere")
    holds_leader = _lock_machine(db_url, elsewhere)  # the leader waits here, alone
    revokes = _lock_machine(db_url, first)  # the batch waits here; the revoke commits meanwhile
    revokes.execute("UPDATE orchestrators SET revoked_at = now() WHERE id = %s", (first,))
    bodies = [(issue_event(issue_id=f"iss-{i}"), f"d-{i}") for i in range(10)]
    combiner = intake._issue_starts(api.pool)

    def waiting_on_locks(watch: Any) -> int:
        return int(watch.execute("SELECT count(*) AS n FROM pg_locks WHERE NOT granted").fetchone()["n"])

    try:
        with ThreadPoolExecutor(len(bodies) + 1) as ex, connect(db_url) as watch:
            leader = ex.submit(api.webhook, issue_event(issue_id="iss-x", assignee="user-2"), "d-x")
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the leader to wait on its machine")
            futures = [ex.submit(api.webhook, *b) for b in bodies]
            _wait_for(lambda: len(combiner._waiting) == len(bodies), "the batch to wait in line")
            holds_leader.commit()
            assert leader.result(30).json()["orchestratorId"] == elsewhere
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the batch to wait on the machine")
            revokes.commit()  # the revoke commits while the batch waits for the machine's row
            answers = [f.result(30).json() for f in futures]
    finally:
        holds_leader.close()
        revokes.close()
    assert [a["status"] for a in answers] == ["dispatched"] * 10
    assert {a["orchestratorId"] for a in answers} == {other}
    assert len({a["sessionId"] for a in answers}) == 10
    with api.pool.connection() as conn:
        on_revoked = conn.execute(
            "SELECT count(*) AS n FROM dispatch_sessions WHERE orchestrator_id = %s", (first,)
        ).fetchone()
    assert on_revoked is not None and on_revoked["n"] == 0
    assert row_counts(api.pool)["sessions"] == 11 and row_counts(api.pool)["queue"] == 11
