"""Issues that arrive together are written together (shared/plumbing/batching.py, `route_and_enqueue_many`):
each answer is what it would be alone, one bad webhook fails only itself, and nothing is answered
before its rows commit. Real Postgres, real HTTP into the real app."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from shared.delivery import intake
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import (
    NO_MACHINE,
    SUPERSEDED,
    UNROUTABLE,
    Ignored,
    Routed,
    Start,
    enqueue_dispatch,
    route_and_enqueue_many,
)
from shared.plumbing.batching import Combiner
from shared.plumbing.db import Pool, connect, open_pool, statement, transaction
from shared.plumbing.settings import Settings
from shared.wire.messages import IssueRef
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.batches import change_of, changes_answered
from tests.helpers.data import MakeOrch, bulk, enqueue_one, issue, row_counts
from tests.helpers.linear import Linear


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
    # (seen before, its own dispatch still queued: nothing is written, its dispatch left alone)
    assert out[1] == NO_MACHINE and out[2] is None
    assert open_dispatches(pool, seen.message.issue.id) == [mine.id]
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


def commit_sizes(pool: Pool, where: str = "true", table: str = "dispatch_sessions") -> list[int]:
    """How many rows each commit wrote, smallest first: the rows one transaction writes share its
    now() (`created_at`, a delivery's `received_at`), and no two transactions here share one."""
    at = "received_at" if table == "webhook_deliveries" else "created_at"
    statement = sql.SQL("SELECT count(*) AS n FROM {} WHERE {} GROUP BY {} ORDER BY n").format(
        sql.Identifier(table),
        sql.SQL(where),
        sql.Identifier(at),
    )
    with pool.connection() as conn:
        return [int(r["n"]) for r in conn.execute(statement)]


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


def waiting_on_locks(watch: Any) -> int:
    """How many lock requests wait in this test's database (`watch`: a connection of the test's own
    to it; pg_locks is the whole server's, where other tests run at the same time)."""
    return int(
        watch.execute(
            "SELECT count(*) AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE NOT l.granted AND a.datname = current_database()"
        ).fetchone()["n"]
    )


def _pile_up(
    api: Api,
    db_url: str,
    oid: str | None,
    bodies: list[tuple[dict[str, Any], str]],
    combiner: Combiner[Any, Any] | None = None,
    holder: psycopg.Connection[Any] | None = None,
    waiting: int = 0,
) -> list[httpx.Response]:
    """The first webhooks, one for each lane of the group commit (`combiner`: the issues' unless
    given), lead alone and wait on a lock (machine `oid`'s row, or what `holder` holds); the others
    arrive meanwhile and wait in line for the next batch; then the lock is let go (rolled back).
    `waiting`: the lock requests of this database already waiting before the first leader's."""
    locker = holder or _lock_machine(db_url, str(oid))
    combiner = combiner or intake._issue_changes(api.pool)
    lanes = combiner.lanes
    try:
        with ThreadPoolExecutor(len(bodies)) as ex:
            futures: list[Future[httpx.Response]] = []
            with connect(db_url) as watch:
                for n, body in enumerate(bodies[:lanes], start=1):
                    futures.append(ex.submit(api.webhook, *body))
                    _wait_for(
                        lambda n=n: waiting_on_locks(watch) == waiting + n, "each leader to wait on the lock"
                    )
            futures += [ex.submit(api.webhook, *b) for b in bodies[lanes:]]
            _wait_for(lambda: len(combiner._waiting) == len(bodies) - lanes, "the others to wait in line")
            locker.rollback()
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
    # The leaders alone, then the rest that waited in one statement: one transaction, one now().
    assert commit_sizes(api.pool) == [1] * intake.LANES + [21 - intake.LANES]
    for body, delivery in bodies:  # each retry is a duplicate of its own session
        again = api.webhook(body, delivery).json()
        assert again["status"] == "duplicate"
    sessions = {a.json()["sessionId"] for a in answers}
    assert {api.webhook(b, d).json()["sessionId"] for b, d in bodies} == sessions


def test_copies_of_one_delivery_in_a_batch_make_one_session(
    api: Api, db_url: str, across_instances: None
) -> None:
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
    combiner = intake._issue_changes(api.pool)

    try:
        with ThreadPoolExecutor(len(bodies) + 1) as ex, connect(db_url) as watch:
            leader = ex.submit(api.webhook, issue_event(issue_id="iss-x", assignee="user-2"), "d-x")
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the leader to wait on its machine")
            # The group commit's other lanes are taken by the first bodies, alone; the rest wait
            # in line for the leader's lane.
            alone = intake.LANES - 1
            futures = [ex.submit(api.webhook, *b) for b in bodies]
            _wait_for(lambda: len(combiner._waiting) == len(bodies) - alone, "the batch to wait in line")
            holds_leader.commit()
            assert leader.result(30).json()["orchestratorId"] == elsewhere
            _wait_for(lambda: waiting_on_locks(watch) == alone + 1, "the batch to wait on the machine")
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


# --- an existing issue assigned (Issue `update` with `updatedFrom.assigneeId`) ----------------------
def assigned(issue_id: str, user: str | None, before: str | None = None) -> dict[str, Any]:
    """An existing issue assigned to `user` (its assignee was `before`)."""
    return issue_event("update", issue_id=issue_id, assignee=user, updated_from={"assigneeId": before})


def open_dispatches(pool: Pool, issue_id: str) -> list[Any]:
    with pool.connection() as conn:
        return [
            r["orchestrator_id"]
            for r in conn.execute(
                "SELECT s.orchestrator_id FROM dispatch_sessions s JOIN dispatch_queue q ON q.session_id = s.id"
                " WHERE s.issue_id = %s AND s.status = 'queued'",
                (issue_id,),
            )
        ]


def _written_once_the_turn_is_let_go(
    pool: Pool, db_url: str, batch: list[Start], holder: psycopg.Connection[Any]
) -> list[Any]:
    """`route_and_enqueue_many(batch)`, which waits for a turn `holder` holds and has written
    nothing meanwhile; then the turn let go (rolled back): its answer."""
    out: list[Any] = []

    def written() -> None:
        with statement(pool) as tx:
            out.extend(route_and_enqueue_many(tx, batch))

    try:
        with connect(db_url) as watch:
            t = threading.Thread(target=written, daemon=True)
            t.start()
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the batch to wait for the turn")
            assert out == []  # (it waits, and has written nothing)
            holder.rollback()
            t.join(10)
    finally:
        holder.close()
    return out


def test_an_issues_start_waits_for_its_turn_and_decides_it_whole_the_cancel_included(
    pool: Pool, make_orchestrator: MakeOrch, db_url: str
) -> None:
    """The batch takes each issue's turn, waiting for one another transaction holds, and then
    decides every element with what it reads after the turn: written, an undelivered dispatch of
    the issue cancelled first (then an assignment is a re-assignment, in the same statement);
    recorded as superseded when a later assignment change of the issue was handled. Two elements of
    one issue: the second is left (its caller writes it after the first)."""
    make_orchestrator(linear_user_id="u")
    earlier = start("u", 1)
    at = datetime(2026, 12, 7, 10, tzinfo=UTC)
    changed = start("nobody", 5)._replace(event_at=at)  # (an assignment, then another)
    with statement(pool) as tx:
        assert isinstance(route_and_enqueue_many(tx, [earlier])[0], Routed)
    with statement(pool) as tx:
        assert route_and_enqueue_many(tx, [changed])[0] == NO_MACHINE
    busy = start("u", 4)
    older = start("u", 5)._replace(event_at=at - timedelta(milliseconds=1))
    same = start("u", 6)._replace(event_at=at)  # (another issue: orders against none)
    batch = [start("u", 1), start("u", 2), start("u", 3), start("u", 3), busy, older, same]
    holder = psycopg.connect(db_url)  # another intake transaction has issue 4's turn
    holder.execute(
        "SELECT pg_advisory_xact_lock(devpilot_issue_turn_key('org-a', %s))", (busy.message.issue.id,)
    )
    out = _written_once_the_turn_is_let_go(pool, db_url, batch, holder)
    assert all(isinstance(out[i], Routed) for i in (0, 1, 2, 4, 6)), out
    assert out[3] is None  # (issue 3 again)
    assert out[5] == SUPERSEDED  # issue 5 was assigned again after this (its retry, say)
    recorded = deliveries(pool)
    assert set(recorded) == {
        earlier.delivery_key,
        changed.delivery_key,
        *(batch[i].delivery_key for i in (0, 1, 2, 4, 5, 6)),
    }
    assert row_counts(pool)["sessions"] == 6
    # issue 1's undelivered dispatch was cancelled first: one start of it is left, the new one
    first = out[0]
    assert isinstance(first, Routed)
    assert open_dispatches(pool, earlier.message.issue.id) == [first.orchestrator_id]
    with pool.connection() as conn:
        statuses = conn.execute(
            "SELECT status FROM dispatch_sessions WHERE issue_id = %s ORDER BY created_at, status",
            (earlier.message.issue.id,),
        ).fetchall()
    assert sorted(r["status"] for r in statuses) == ["cancelled", "queued"]


def test_existing_issues_assigned_together_commit_together_and_a_reassignment_cancels(
    api: Api, db_url: str
) -> None:
    """Existing issues assigned (nothing to cancel) take the group commit as creations do: one
    statement. A re-assignment goes the same way (one statement, its own kind only in what the
    statement finds): an issue with an undelivered start has the old machine's start cancelled and
    the new assignee's machine gets one."""
    laptop, _ = api.register(user="user-1")
    other, _ = api.register(user="user-2", name="other")
    first = api.webhook(issue_event(issue_id="iss-re"), "d-re-0").json()  # created, assigned to user-1
    assert first["status"] == "dispatched" and first["orchestratorId"] == laptop
    reassigned = (assigned("iss-re", "user-2", "user-1"), "d-re-1")
    bodies = [reassigned] + [(assigned(f"iss-{i}", "user-1"), f"d-{i}") for i in range(12)]
    answers = [a.json() for a in _pile_up(api, db_url, laptop, bodies)]
    assert [a["status"] for a in answers] == ["dispatched"] * 13
    assert answers[0]["orchestratorId"] == other and answers[0]["cancelledSessionId"] == first["sessionId"]
    assert "cancelledSessionId" not in answers[1]
    assert open_dispatches(api.pool, "iss-re") == [uuid.UUID(other)]
    with api.pool.connection() as conn:
        cancelled = conn.execute("SELECT status FROM dispatch_sessions WHERE id = %s", (first["sessionId"],))
        assert cancelled.fetchone()["status"] == "cancelled"  # type: ignore[index]
    # The leaders alone (the re-assignment one of them), then the rest of the twelve in one statement.
    twelve = "issue_id LIKE 'iss-%' AND issue_id <> 'iss-re'"
    assert commit_sizes(api.pool, twelve) == [1] * (intake.LANES - 1) + [12 - (intake.LANES - 1)]
    for body, delivery in bodies:  # retries: duplicates of their own sessions
        assert api.webhook(body, delivery).json()["status"] == "duplicate"


@pytest.mark.parametrize("change", ["unassigned", "reassigned"])
def test_a_dispatch_committed_while_a_change_waits_for_the_turn_is_cancelled(
    change: str, api: Api, db_url: str
) -> None:
    """Another transaction holds the issue's turn and queues a start of it (another instance's
    assignment, say) while an unassignment or a re-assignment of the issue waits for the turn. The
    change's statement took its snapshot before that commit, so it cannot delete that row: it writes
    nothing, and the intake writes it again in a new statement, which cancels the start. Without
    that, the issue would be left with the start it was unassigned from (or with two)."""
    laptop, _ = api.register(user="user-1")
    desk, _ = api.register(user="user-2", name="desk")
    body = assigned("iss-late", None if change == "unassigned" else "user-2", "user-1")
    with ThreadPoolExecutor(1) as ex, connect(db_url) as watch:
        with transaction(api.pool) as tx:
            tx.execute("SELECT pg_advisory_xact_lock(devpilot_issue_turn_key('org-a', 'iss-late'))")
            late = enqueue_dispatch(
                tx,
                org_id="org-a",
                orchestrator_id=uuid.UUID(laptop),
                linear_user_id="user-1",
                message=DispatchPayload(issue=IssueRef(id="iss-late", identifier="L-1")),
            )
            answer = ex.submit(api.webhook, body, "d-late")
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the change to wait for the turn")
        said = answer.result(30).json()
    if change == "unassigned":
        assert said == {"status": "cancelled", "sessionId": str(late.session_id)}
        assert open_dispatches(api.pool, "iss-late") == []
    else:
        assert said["status"] == "dispatched" and said["orchestratorId"] == desk
        assert said["cancelledSessionId"] == str(late.session_id)
        assert open_dispatches(api.pool, "iss-late") == [uuid.UUID(desk)]


def test_two_changes_of_one_issue_in_one_batch_are_written_one_after_the_other(api: Api) -> None:
    """A batch's cancels run before its starts, so two changes of one issue in it would each find
    nothing of the other's to cancel. (One process never puts them in one batch: its webhooks of an
    issue go one at a time.) The second is written after the first, in a transaction of its own: it
    cancels the first one's start, and one start is left, for the last assignee's machine."""
    one, _ = api.register(user="user-1")
    api.register(user="user-2", name="other")
    first = api.webhook(issue_event(issue_id="iss-twice")).json()  # created, assigned to user-1
    assert first["orchestratorId"] == one
    to_two = change_of(assigned("iss-twice", "user-2", "user-1"), "d-twice-1")
    back = change_of(assigned("iss-twice", "user-1", "user-2"), "d-twice-2")
    answers = changes_answered(api.pool, [to_two, back])
    assert [a.answer["status"] if a is not None else None for a in answers] == ["dispatched", "dispatched"]
    assert answers[1] is not None and answers[1].answer["orchestratorId"] == one
    assert open_dispatches(api.pool, "iss-twice") == [uuid.UUID(one)]  # (none left for `two`)


def test_concurrent_assignments_of_one_issue_leave_one_start(api: Api) -> None:
    """Many people re-assigning one issue at once (each a delivery of its own, between two people's
    machines, arriving together, in any order): every webhook is answered, and the issue is left
    with exactly one undelivered start, the last assignment's in Linear's order, every other start
    cancelled by the assignment after it; one handled after a later one does nothing
    (`assignment_superseded`). Without the issue's turn, two of them could both find nothing to
    cancel and both dispatch."""
    m1, _ = api.register(user="user-1")
    m2, _ = api.register(user="user-2", name="other")
    assert m1 != m2
    for issue_n in range(6):
        issue_id = f"iss-race-{issue_n}"
        users = ["user-1", "user-2"] * 6
        with ThreadPoolExecutor(len(users)) as ex:
            futures = [
                ex.submit(api.webhook, assigned(issue_id, u, "someone"), f"d-{issue_id}-{i}")
                for i, u in enumerate(users)
            ]
            answers = [f.result(30) for f in futures]
        assert {a.status_code for a in answers} == {200}, [a.text for a in answers]
        said = [a.json() for a in answers]
        assert said[-1]["status"] == "dispatched"  # (the last in Linear's order: nothing supersedes it)
        assert all(a["status"] == "dispatched" or a.get("reason") == "assignment_superseded" for a in said)
        assert [str(o) for o in open_dispatches(api.pool, issue_id)] == [m2]  # the last one's: users[-1]
        with api.pool.connection() as conn:
            statuses = conn.execute(
                "SELECT status, count(*) AS n FROM dispatch_sessions WHERE issue_id = %s GROUP BY status",
                (issue_id,),
            ).fetchall()
        # every start but one was cancelled by the assignment after it
        dispatched = sum(a["status"] == "dispatched" for a in said)
        assert {r["status"]: r["n"] for r in statuses} == {"queued": 1, "cancelled": dispatched - 1}


# --- agent sessions `created` together ------------------------------------------------------------
def agent_start(user: str, session: str, *, delivery: str | None = None, org: str = "org-a") -> Start:
    key = delivery or f"d-{uuid.uuid4()}"
    message = DispatchPayload(issue=issue(7, org), agent_session_id=session, kind="start")
    return Start(org, user, message, key, f"c-{key}")


def test_agent_sessions_in_one_batch_are_each_answered_as_alone(
    pool: Pool, make_orchestrator: MakeOrch, db_url: str
) -> None:
    """The agent sessions' statement writes each element as the one statement would: the session,
    its queue row and the "Queued for" thought of a connected org, for the user's machine. It waits
    for a turn another transaction holds. It records, and starts nothing for, a user with no
    machine (Linear told why, an `error`) and an agent session started already or stopped. It
    writes nothing for a delivery seen before, a copy, or a second element of one agent session
    (its caller writes that after the first). Neither does the one statement."""
    laptop = make_orchestrator(linear_user_id="has-machine", name="laptop")
    bulk(
        pool,
        "INSERT INTO linear_credentials (org_id, token_encrypted, kind) VALUES ('org-a', '\\x00', 'static')",
    )
    seen = agent_start("has-machine", "as-seen", delivery="seen-before")
    assert isinstance(intake._one_statement(pool, seen), Routed)
    busy = agent_start("has-machine", "as-busy")
    bulk(pool, "INSERT INTO agent_session_stops (org_id, agent_session_id) VALUES ('org-a', 'as-stopped')")
    stopped = agent_start("has-machine", "as-stopped")
    again = agent_start("has-machine", "as-seen")  # (another delivery: a follow-up started it)
    assert intake._one_statement(pool, stopped) == Ignored("agent_session_stopped", None)
    assert intake._one_statement(pool, again) == Ignored("agent_session_started", None)
    alone = {stopped.delivery_key, again.delivery_key}  # (recorded: they start nothing)
    stopped, again = agent_start("has-machine", "as-stopped"), agent_start("has-machine", "as-seen")
    holder = psycopg.connect(db_url)  # another intake transaction has as-busy's turn
    holder.execute("SELECT pg_advisory_xact_lock(devpilot_agent_session_turn_key('org-a', 'as-busy'))")
    batch = [
        agent_start("has-machine", "as-1"),
        agent_start("nobody", "as-2"),
        seen,
        agent_start("has-machine", "as-3"),
        agent_start("has-machine", "as-3"),  # (the same agent session again)
        busy,
        stopped,
        again,
    ]
    out = _written_once_the_turn_is_let_go(pool, db_url, batch, holder)
    assert all(isinstance(out[i], Routed) for i in (0, 3, 5)), out
    assert out[2] is None  # (seen before)
    assert out[4] is None and out[7] is None  # (as-3, as-seen again: written after the first)
    assert out[6] == Ignored("agent_session_stopped", None)
    unroutable = out[1]
    assert isinstance(unroutable, Ignored) and unroutable.reason == "no_orchestrator"
    with pool.connection() as conn:
        told = conn.execute(
            "SELECT id, kind, body FROM linear_notices WHERE agent_session_id = 'as-2'"
        ).fetchall()
    assert told == [{"id": unroutable.notice_id, "kind": "failed", "body": UNROUTABLE}]
    assert out[0].orchestrator_id == out[3].orchestrator_id == laptop.id
    recorded = deliveries(pool)
    assert set(recorded) == {"seen-before", *alone, *(batch[i].delivery_key for i in (0, 1, 3, 5, 6))}
    assert {recorded[batch[i].delivery_key][0] for i in (1, 6)} == {"ignored"}
    for i in (0, 3):
        routed = out[i]
        assert isinstance(routed, Routed)
        assert recorded[batch[i].delivery_key] == ("dispatched", routed.enqueued.session_id)
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT s.status, s.kind, s.agent_session_id, q.id AS queue_id, q.message_id,"
                " q.agent_session_id AS queued_for, q.payload, n.id AS notice_id, n.body, n.kind AS notice"
                " FROM dispatch_sessions s JOIN dispatch_queue q ON q.session_id = s.id"
                " JOIN linear_notices n ON n.session_id = s.id WHERE s.id = %s",
                (routed.enqueued.session_id,),
            ).fetchone()
        assert row is not None
        assert (row["status"], row["kind"]) == ("queued", "start")
        assert row["agent_session_id"] == row["queued_for"] == batch[i].message.agent_session_id
        assert row["payload"]["agentSessionId"] == batch[i].message.agent_session_id
        assert row["queue_id"] == routed.enqueued.queue_id and row["message_id"] == routed.enqueued.message_id
        assert row["notice_id"] == routed.enqueued.notice_id
        assert (row["notice"], row["body"]) == ("dispatched", "Queued for laptop")
    assert row_counts(pool)["sessions"] == 4 and row_counts(pool)["queue"] == 4


def test_a_batch_holds_starts_of_one_kind(pool: Pool, make_orchestrator: MakeOrch) -> None:
    make_orchestrator(linear_user_id="u")
    with statement(pool) as tx, pytest.raises(ValueError, match="not both"):
        route_and_enqueue_many(tx, [start("u", 1), agent_start("u", "as-1")])
    assert row_counts(pool)["sessions"] == 0 and deliveries(pool) == {}


def test_agent_sessions_created_together_commit_together_each_answered_as_alone(
    api: Api, db_url: str, linear: Linear, across_instances: None
) -> None:
    """(The copy of a delivery reaches another instance of the service, as Linear's two webhooks
    of one change may: it waits in the same line, and is left out of the batch.)"""
    oid, token = api.register(user="user-1", name="laptop")
    bodies = [(agent_session_event(session_id=f"as-{i}"), f"d-as-{i}") for i in range(14)]
    bodies.append((agent_session_event(session_id="as-3"), "d-as-3"))  # a copy of one delivery
    answers = [a.json() for a in _pile_up(api, db_url, oid, bodies, intake._agent_session_starts(api.pool))]
    assert [a["status"] for a in answers[:14]] == ["dispatched"] * 14
    assert {a["kind"] for a in answers[:14]} == {"start"}
    assert {a["orchestratorId"] for a in answers[:14]} == {oid}
    assert answers[14] == {"status": "duplicate", "sessionId": answers[3]["sessionId"]}
    assert row_counts(api.pool)["sessions"] == 14 and row_counts(api.pool)["queue"] == 14
    assert commit_sizes(api.pool) == [1] * intake.LANES + [14 - intake.LANES]
    # Linear hears "Queued for laptop" in each of the fourteen agent sessions, once.
    linear.wait(14)
    queued = [a for a in linear.activities() if a["content"].get("body") == "Queued for laptop"]
    assert sorted(a["agentSessionId"] for a in queued) == sorted(f"as-{i}" for i in range(14))
    r = api.post_as(token, "/claim", {"max": 100})
    assert sorted(m["agentSessionId"] for m in r.json()["messages"]) == sorted(f"as-{i}" for i in range(14))


def test_a_follow_up_while_its_start_is_written_in_a_batch_is_queued_behind_it(
    api: Api, db_url: str, across_instances: None
) -> None:
    """A `prompted` that arrives (at another instance of the service) while its agent session's
    `created` is being written in a batch (the batch holds the agent session's turn, and waits for
    the machine's row) waits for the batch's commit, and is then a `prompt` for the machine that holds the conversation, queued
    after the start. Had it not waited, it would have found no holder and become a second start."""
    laptop, token = api.register(user="user-1", name="laptop")
    elsewhere, _ = api.register(user="user-2", name="elsewhere")
    holds_leaders = _lock_machine(db_url, elsewhere)  # the leaders wait here, alone
    holds_batch = _lock_machine(db_url, laptop)  # the batch waits here, holding its turns
    combiner = intake._agent_session_starts(api.pool)
    lanes = intake.LANES
    leaders = [
        (agent_session_event(session_id=f"as-x{i}", creator="user-2"), f"d-x{i}") for i in range(lanes)
    ]
    bodies = [(agent_session_event(session_id=f"as-{i}"), f"d-as-{i}") for i in range(4)]
    follow = agent_session_event(session_id="as-3", action="prompted", body="and the docs too")
    try:
        with ThreadPoolExecutor(8) as ex, connect(db_url) as watch:
            firsts = []
            for n, body in enumerate(leaders, start=1):
                firsts.append(ex.submit(api.webhook, *body))
                _wait_for(lambda n=n: waiting_on_locks(watch) == n, "each leader to wait on its machine")
            futures = [ex.submit(api.webhook, *b) for b in bodies]
            _wait_for(lambda: len(combiner._waiting) == len(bodies), "the batch to wait in line")
            holds_leaders.commit()
            assert {f.result(30).json()["orchestratorId"] for f in firsts} == {elsewhere}
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the batch to wait on the laptop's row")
            prompt = ex.submit(api.webhook, follow, "d-follow")
            _wait_for(lambda: waiting_on_locks(watch) == 2, "the follow-up to wait for as-3's turn")
            holds_batch.commit()
            answers = [f.result(30).json() for f in futures]
            answered = prompt.result(30).json()
    finally:
        holds_leaders.close()
        holds_batch.close()
    assert [a["status"] for a in answers] == ["dispatched"] * 4
    assert {a["orchestratorId"] for a in answers} == {laptop}
    assert answered["status"] == "dispatched" and answered["kind"] == "prompt"
    assert answered["orchestratorId"] == laptop
    assert commit_sizes(api.pool, "agent_session_id LIKE 'as-_' AND kind = 'start'") == [4]  # one statement
    got = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
    assert [m["kind"] for m in got if m["agentSessionId"] == "as-3"] == ["start"]  # the prompt waits
    [start3] = [m for m in got if m["agentSessionId"] == "as-3"]
    ack = {"queueId": start3["queueId"], "claimToken": start3["claimToken"]}
    assert api.post_as(token, "/ack", ack).status_code == 200
    [then] = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
    assert (then["agentSessionId"], then["kind"]) == ("as-3", "prompt")


def test_follow_ups_that_arrive_together_commit_together_each_for_its_holder(api: Api, db_url: str) -> None:
    """Follow-ups in agent sessions a machine holds take their own group commit: the leaders alone,
    then the rest in one statement, each a `prompt` for its holder queued behind its start."""
    oid, token = api.register(user="user-1", name="laptop")
    for i in range(12):
        assert api.webhook(agent_session_event(session_id=f"as-{i}"), f"d-as-{i}").json()["kind"] == "start"
    bodies = [
        (agent_session_event(session_id=f"as-{i}", action="prompted", body=f"more {i}"), f"d-p-{i}")
        for i in range(12)
    ]
    answers = [a.json() for a in _pile_up(api, db_url, oid, bodies, intake._follow_ups(api.pool))]
    assert [(a["status"], a["kind"], a["orchestratorId"]) for a in answers] == [
        ("dispatched", "prompt", oid)
    ] * 12
    assert commit_sizes(api.pool, "kind = 'prompt'") == [1] * intake.LANES + [12 - intake.LANES]
    starts = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
    assert sorted(m["kind"] for m in starts) == ["start"] * 12  # each prompt behind its start
    for body, delivery in bodies:  # retries: duplicates of their own sessions
        assert api.webhook(body, delivery).json()["status"] == "duplicate"


# --- deliveries that do nothing (an issue edited, its assignee unchanged) ----------------------------
def edited(issue_id: str) -> dict[str, Any]:
    return issue_event("update", issue_id=issue_id, updated_from={"title": "an older title"})


def test_deliveries_that_do_nothing_are_recorded_together_each_once(pool: Pool) -> None:
    """One statement records several: each recorded now is True; one seen before, and a copy of an
    earlier element's delivery key or content key, are False and get nothing written."""
    assert intake.record_ignored(pool, [("k-seen", "c-seen")]) == [True]
    batch = [("k-1", "c-1"), ("k-seen", "c-new"), ("k-2", "c-2"), ("k-1", "c-other"), ("k-3", "c-2")]
    assert intake.record_ignored(pool, batch) == [True, False, True, False, False]
    recorded = deliveries(pool)
    assert set(recorded) == {"k-seen", "k-1", "k-2"}
    assert {outcome for outcome, _ in recorded.values()} == {"ignored"}


def _held_deliveries(db_url: str, keys: list[str]) -> psycopg.Connection[Any]:
    """An open transaction that has inserted these delivery keys: a statement inserting one of them
    waits for it (and, when it rolls back, inserts it)."""
    conn = psycopg.connect(db_url)
    for key in keys:
        conn.execute("INSERT INTO webhook_deliveries (delivery_key, outcome) VALUES (%s, 'held')", (key,))
    return conn


def test_edits_that_arrive_together_commit_together_each_answered_as_alone(api: Api, db_url: str) -> None:
    """Deliveries that do nothing take their own group commit: while the leaders wait (here on a
    transaction that holds their keys), the rest wait in line and are recorded in one statement;
    each is answered `ignored`, and each retry `duplicate`."""
    bodies = [(edited(f"iss-{i}"), f"d-edit-{i}") for i in range(14)]
    lanes = intake.EDIT_LANES
    holder = _held_deliveries(db_url, [f"delivery:d-edit-{i}" for i in range(lanes)])
    combiner = intake._ignored_deliveries(api.pool)
    answers = [a.json() for a in _pile_up(api, db_url, None, bodies, combiner, holder)]
    assert answers == [{"status": "ignored", "reason": "assignee_unchanged"}] * 14
    assert commit_sizes(api.pool, table="webhook_deliveries") == [1] * lanes + [14 - lanes]
    for edit, delivery in bodies:
        assert api.webhook(edit, delivery).json()["status"] == "duplicate"


# --- one issue's, or one agent session's, webhooks in arrival order within an instance --------------
def _one_behind_the_other(
    api: Api, db_url: str, agent_sessions: bool, first: tuple[dict[str, Any], str], then: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`first` waits in the group commit's line (every lane taken by leaders waiting on another
    user's machine); `then`, of the same issue or agent session, is sent next and must wait behind
    it in this instance's line (`shared.plumbing.in_order`); then the leaders go. Both answers."""
    elsewhere, _ = api.register(user="user-2", name="elsewhere")
    combiner = intake._agent_session_starts(api.pool) if agent_sessions else intake._issue_changes(api.pool)
    leaders = [
        (agent_session_event(session_id=f"as-x{i}", creator="user-2"), f"d-x{i}")
        if agent_sessions
        else (issue_event(issue_id=f"iss-x{i}", assignee="user-2"), f"d-x{i}")
        for i in range(intake.LANES)
    ]
    key = (
        ("org-a", "agent_session", first[0]["agentSession"]["id"])
        if agent_sessions
        else ("org-a", "issue", first[0]["data"]["id"])
    )
    locker = _lock_machine(db_url, elsewhere)
    try:
        with ThreadPoolExecutor(8) as ex, connect(db_url) as watch:
            for n, body in enumerate(leaders, start=1):
                ex.submit(api.webhook, *body)
                _wait_for(lambda n=n: waiting_on_locks(watch) == n, "each leader to wait on its machine")
            ahead = ex.submit(api.webhook, *first)
            _wait_for(lambda: len(combiner._waiting) == 1, "the first to wait in the group commit's line")
            behind = ex.submit(api.webhook, then)
            _wait_for(lambda: intake.IN_ORDER.waiting(key) == 2, "the next to wait behind it")
            locker.commit()
            return ahead.result(30).json(), behind.result(30).json()
    finally:
        locker.close()


def test_a_stop_never_overtakes_the_start_waiting_in_line_before_it(api: Api, db_url: str) -> None:
    """An agent session's `created` waits in the group commit's line: it holds no turn yet. Its
    stop, arriving next, waits for it and then cancels the start, which the machine never gets.
    Overtaking, it would find nothing to cancel, and the start would be queued after the stop."""
    _, token = api.register(user="user-1", name="laptop")
    stop = agent_session_event(session_id="as-3", action="prompted", signal="stop")
    started, stopped = _one_behind_the_other(
        api, db_url, True, (agent_session_event(session_id="as-3"), "d"), stop
    )
    assert started["status"] == "dispatched"
    assert stopped["status"] == "stopped" and stopped["cancelledSessionIds"] == [started["sessionId"]]
    assert api.post_as(token, "/claim", {"max": 100}).json()["messages"] == []


def test_a_follow_up_never_overtakes_the_start_waiting_in_line_before_it(api: Api, db_url: str) -> None:
    """The same for a follow-up: it waits for the start and is then a `prompt` behind it.
    Overtaking, it would find no holder and be queued as a second start."""
    laptop, _ = api.register(user="user-1", name="laptop")
    more = agent_session_event(session_id="as-3", action="prompted", body="more")
    started, answered = _one_behind_the_other(
        api, db_url, True, (agent_session_event(session_id="as-3"), "d"), more
    )
    assert started["kind"] == "start"
    assert answered["kind"] == "prompt" and answered["orchestratorId"] == laptop
    with api.pool.connection() as conn:
        kinds = conn.execute(
            "SELECT s.kind FROM dispatch_sessions s JOIN dispatch_queue q ON q.session_id = s.id"
            " WHERE s.agent_session_id = 'as-3' ORDER BY q.seq"
        ).fetchall()
    assert [k["kind"] for k in kinds] == ["start", "prompt"]


def test_an_unassignment_never_overtakes_the_assignment_waiting_in_line_before_it(
    api: Api, db_url: str
) -> None:
    """An issue created assigned waits in the issues' line; its unassignment, arriving next, waits
    for it and then cancels its start. Overtaking, it would find nothing to cancel, and the start
    would be queued for an issue nobody is assigned."""
    _, token = api.register(user="user-1", name="laptop")
    on = issue_event(issue_id="iss-3")
    off = assigned("iss-3", None, "user-1")  # (the later change in Linear)
    started, cancelled = _one_behind_the_other(api, db_url, False, (on, "d"), off)
    assert started["status"] == "dispatched"
    assert cancelled == {"status": "cancelled", "sessionId": started["sessionId"]}
    assert api.post_as(token, "/claim", {"max": 100}).json()["messages"] == []


def _hold_turns(db_url: str, issue_ids: list[str]) -> psycopg.Connection[Any]:
    """Holds the turns of these issues (org-a's), so an assignment change of one of them waits."""
    conn = psycopg.connect(db_url)
    for issue_id in issue_ids:
        conn.execute("SELECT pg_advisory_xact_lock(devpilot_issue_turn_key('org-a', %s))", (issue_id,))
    return conn


def test_assignment_changes_that_arrive_together_commit_together_each_answered_as_alone(
    api: Api, db_url: str
) -> None:
    """Re-assignments and unassignments (`cancel_and_start`, `cancel`) that arrive while others are
    being written are written together: one transaction, every change's turn taken first, then each
    one's cancel and start. Each is answered as it would be alone: the start it cancelled, the new
    assignee's machine, nothing to cancel, or no machine; and its retry is a duplicate."""
    laptop, _ = api.register(user="user-1")
    desk, _ = api.register(user="user-2", name="desk")
    for i in range(8):  # each issue's start, on the laptop
        assert api.webhook(issue_event(issue_id=f"iss-{i}"), f"d-start-{i}").json()["status"] == "dispatched"
    bodies = [(assigned(f"iss-{i}", None, "user-1"), f"d-un-{i}") for i in range(4)]  # unassigned
    bodies += [(assigned(f"iss-{i}", "user-2", "user-1"), f"d-re-{i}") for i in range(4, 8)]  # to desk
    bodies.append((assigned("iss-none", "user-9", "user-1"), "d-nobody"))  # nobody's machine
    bodies.append((assigned("iss-nothing", None, "user-1"), "d-nothing"))  # nothing to cancel
    # The leaders (one for each lane) wait for their issues' turns; the rest wait in line.
    holder = _hold_turns(db_url, ["iss-0", "iss-4"])
    leaders = [bodies[0], bodies[4]]
    rest = [b for b in bodies if b not in leaders]
    answers = _pile_up(api, db_url, None, leaders + rest, intake._issue_changes(api.pool), holder)
    got = dict(zip([d for _, d in leaders + rest], [a.json() for a in answers], strict=True))
    for i in range(4):
        assert got[f"d-un-{i}"]["status"] == "cancelled"
        assert open_dispatches(api.pool, f"iss-{i}") == []
    for i in range(4, 8):
        moved = got[f"d-re-{i}"]
        assert (
            moved["status"] == "dispatched"
            and moved["orchestratorId"] == desk
            and moved["cancelledSessionId"]
        )
        assert open_dispatches(api.pool, f"iss-{i}") == [uuid.UUID(desk)]
    assert got["d-nobody"] == {"status": "ignored", "reason": "no_orchestrator"}
    assert got["d-nothing"] == {"status": "ignored", "reason": "nothing_to_cancel"}
    assert laptop not in {a.get("orchestratorId") for a in got.values()}
    # The leaders alone, then the rest of the ten in one transaction (one now() for its deliveries).
    changes = "delivery_key NOT LIKE 'delivery:d-start-%'"
    assert commit_sizes(api.pool, changes, "webhook_deliveries") == [1] * intake.LANES + [10 - intake.LANES]
    for body, delivery in leaders + rest:  # retries: duplicates, with the session each made or cancelled
        again = api.webhook(body, delivery).json()
        assert again["status"] == "duplicate"
        assert again["sessionId"] == got[delivery].get("sessionId")


def test_a_batch_the_database_fails_midway_commits_nothing_and_its_connection_stays_clean(
    db_url: str, settings: Settings, make_orchestrator: MakeOrch
) -> None:
    """A batch of assignment changes is one transaction whose statements are sent at once. When the
    database fails one of them after an earlier one wrote (here the second change's turn, held
    elsewhere past the lock timeout, after the first change's delivery was recorded), nothing of
    the batch commits, and the pooled connection goes back clean: the next batch on it (the only
    one the pool has) is written as if nothing had happened."""
    o = make_orchestrator()
    pool_of_one = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        sid, _ = enqueue_one(pool_of_one, o, 1)
        changes = [change_of(assigned(issue(n).id, None, "user-1"), f"d-midway-{n}") for n in (1, 2)]
        holder = _hold_turns(db_url, [issue(2).id])
        with pytest.raises(psycopg.errors.LockNotAvailable):
            changes_answered(pool_of_one, changes)
        with pool_of_one.connection() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert deliveries(pool_of_one) == {}
        assert open_dispatches(pool_of_one, issue(1).id) == [o.id]
        holder.rollback()
        holder.close()
        answers = [r.answer if r is not None else None for r in changes_answered(pool_of_one, changes)]
        assert answers == [
            {"status": "cancelled", "sessionId": str(sid)},
            {"status": "ignored", "reason": "nothing_to_cancel"},
        ]
        assert set(deliveries(pool_of_one)) == {"delivery:d-midway-1", "delivery:d-midway-2"}
    finally:
        pool_of_one.close()


# --- stops --------------------------------------------------------------------------------------------
def test_stops_that_arrive_together_commit_together_each_answered_as_alone(api: Api, db_url: str) -> None:
    """Stops that arrive while others are being written are written together: one transaction,
    every stop's agent session turn taken first, then each one's cancel and its `stop` or Linear's
    notice. Each is answered as it would be alone: the start it cancelled (nobody had it yet), or
    the `stop` queued for the machine that had it; and its retry is a duplicate."""
    laptop, token = api.register(user="user-1", name="laptop")
    starts = {
        f"as-{i}": api.webhook(agent_session_event(session_id=f"as-{i}"), f"d-as-{i}").json()["sessionId"]
        for i in range(6)
    }
    claimed = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
    held = ["as-3", "as-4", "as-5"]  # delivered to the laptop: the laptop has them
    for m in claimed:  # (the others stay claimed, not delivered: nobody has them yet)
        if m["agentSessionId"] in held:
            r = api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
            assert r.json() == {"status": "acked"}, r.text
    bodies = [
        (agent_session_event(session_id=s, action="prompted", signal="stop"), f"d-stop-{s}")
        for s in [*sorted(starts), "as-never"]
    ]
    holder = psycopg.connect(db_url)  # the leaders (one for each lane) wait for their turns
    for s in ("as-0", "as-3"):
        holder.execute("SELECT pg_advisory_xact_lock(devpilot_agent_session_turn_key('org-a', %s))", (s,))
    leaders = [bodies[0], bodies[3]]
    rest = [b for b in bodies if b not in leaders]
    answers = _pile_up(
        api,
        db_url,
        None,
        leaders + rest,
        intake._combiner(api.pool, "stops", intake._stop_agent_sessions),
        holder,
    )
    got = dict(zip([d for _, d in leaders + rest], [a.json() for a in answers], strict=True))
    for s in ("as-0", "as-1", "as-2"):
        assert got[f"d-stop-{s}"] == {
            "status": "stopped",
            "cancelledSessionIds": [starts[s]],
            "stopSessionId": None,
        }
    stops = set()
    for s in held:
        answer = got[f"d-stop-{s}"]
        assert answer["status"] == "stopped" and answer["cancelledSessionIds"] == []
        stops.add(answer["stopSessionId"])
    assert got["d-stop-as-never"] == {"status": "stopped", "cancelledSessionIds": [], "stopSessionId": None}
    with api.pool.connection() as conn:
        sent = conn.execute(
            "SELECT id::text AS id, orchestrator_id::text AS machine, agent_session_id FROM dispatch_sessions"
            " WHERE kind = 'stop' AND status = 'queued' ORDER BY agent_session_id"
        ).fetchall()
    assert [(r["agent_session_id"], r["machine"]) for r in sent] == [(s, laptop) for s in held]
    assert {r["id"] for r in sent} == stops
    # The leaders alone, then the rest of the seven in one transaction (one now() for its deliveries).
    assert commit_sizes(api.pool, "delivery_key LIKE 'delivery:d-stop-%'", "webhook_deliveries") == [
        1
    ] * intake.LANES + [7 - intake.LANES]
    for body, delivery in leaders + rest:  # retries: duplicates, which stop nothing again
        assert api.webhook(body, delivery).json() == {"status": "duplicate", "sessionId": None}
    with api.pool.connection() as conn:
        again = conn.execute("SELECT count(*) AS n FROM dispatch_sessions WHERE kind = 'stop'").fetchone()
    assert again == {"n": 3}


def test_copies_of_one_stop_in_a_batch_stop_it_once(api: Api, db_url: str, across_instances: None) -> None:
    """Copies of one stop (the same delivery again, or the same stop under another delivery id)
    that reach one batch of stops: the first copy stops the agent session, and each other copy,
    finding the delivery recorded by that same transaction, writes nothing and is answered
    `duplicate`. The other stops of the batch are written as they would be alone."""
    api.register(user="user-1", name="laptop")
    starts = {
        s: api.webhook(agent_session_event(session_id=s), f"d-{s}").json()["sessionId"]
        for s in ("as-0", "as-1", "as-2", "as-3")
    }

    def stop(s: str) -> dict[str, Any]:
        return agent_session_event(session_id=s, action="prompted", signal="stop")

    holder = psycopg.connect(db_url)  # the leaders (one for each lane) wait for their turns
    for s in ("as-0", "as-1"):
        holder.execute("SELECT pg_advisory_xact_lock(devpilot_agent_session_turn_key('org-a', %s))", (s,))
    leaders = [(stop("as-0"), "d-stop-as-0"), (stop("as-1"), "d-stop-as-1")]
    copied = stop("as-2")  # (the same activity: under another delivery id, the same content)
    copies = [(copied, "d-stop-as-2")] * 3 + [(copied, "d-stop-as-2-again")]
    rest = [(stop("as-3"), "d-stop-as-3"), *copies]
    combiner = intake._combiner(api.pool, "stops", intake._stop_agent_sessions)
    answers = [a.json() for a in _pile_up(api, db_url, None, leaders + rest, combiner, holder)]
    stopped = {"status": "stopped", "cancelledSessionIds": [starts["as-2"]], "stopSessionId": None}
    duplicate = {"status": "duplicate", "sessionId": None}
    assert sorted(answers[-4:], key=lambda a: a["status"] == "duplicate") == [stopped] + [duplicate] * 3
    for s, answer in zip(("as-0", "as-1", "as-3"), answers[:3], strict=True):
        assert answer == {"status": "stopped", "cancelledSessionIds": [starts[s]], "stopSessionId": None}
    # The leaders alone, then as-3's stop and the first copy in one transaction.
    assert commit_sizes(api.pool, "delivery_key LIKE 'delivery:d-stop-%'", "webhook_deliveries") == [
        1
    ] * intake.LANES + [2]
    assert row_counts(api.pool)["queue"] == 0
