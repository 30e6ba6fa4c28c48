"""A follow-up (`prompted`, the `select` signal's answers among them) is one statement, its own
transaction (`follow_ups`, `follow_ups_for_delivery`; several that arrive together, one statement
too), which waits for the agent session's turn and decides the follow-up whole, with reads taken
after the turn: nothing of it is left to another way. Real Postgres, real HTTP into the real app."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.delivery import intake
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import (
    REVOKED,
    UNROUTABLE,
    Asked,
    FollowUp,
    Ignored,
    Routed,
    RouteOutcome,
    Start,
    enqueue_dispatch,
    follow_ups,
)
from shared.plumbing.db import Pool, connect, statement, transaction
from shared.wire.messages import IssueRef, Prompt
from tests.helpers.api import Api, agent_session_event
from tests.helpers.data import MakeOrch, bulk, row_counts
from tests.test_group_commit import _lock_machine, _wait_for, waiting_on_locks

ISSUE = IssueRef(id="issue-as", identifier="ENG-7")


def started(pool: Pool, user: str, agent_session: str) -> Routed:
    """The agent session `created`, as its one statement writes it."""
    key = f"d-{uuid.uuid4()}"
    message = DispatchPayload(issue=ISSUE, agent_session_id=agent_session, kind="start")
    routed = intake._one_statement(pool, Start("org-a", user, message, key, f"c-{key}"))
    assert isinstance(routed, Routed)
    return routed


def prompted(
    agent_session: str,
    *,
    delivery: str | None = None,
    user: str | None = "user-1",
    issue: IssueRef | None = ISSUE,
    written_at: datetime | None = None,
    picked: str | None = None,
) -> FollowUp:
    key = delivery or f"d-{uuid.uuid4()}"
    message = DispatchPayload(
        issue=issue or IssueRef(id=""),
        agent_session_id=agent_session,
        kind="prompt",
        prompt=Prompt(body="more"),
    )
    return FollowUp("org-a", user, message, key, f"c-{key}", written_at, picked, issue is not None)


def follow_up(pool: Pool, agent_session: str, **kwargs: Any) -> RouteOutcome:
    with statement(pool) as tx:
        [outcome] = follow_ups(tx, [prompted(agent_session, **kwargs)])
    return outcome


def rows_of(pool: Pool, agent_session: str) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT s.kind, s.status, s.orchestrator_id, s.issue_id, q.seq, q.payload FROM dispatch_sessions s"
            " LEFT JOIN dispatch_queue q ON q.session_id = s.id WHERE s.agent_session_id = %s"
            " ORDER BY s.created_at, q.seq",
            (agent_session,),
        ).fetchall()


def delivery(pool: Pool, key: str) -> dict[str, Any] | None:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT outcome, session_id FROM webhook_deliveries WHERE delivery_key = %s", (key,)
        ).fetchone()


def requests_of(pool: Pool, agent_session: str) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT id, need, linear_user_id, message->>'kind' AS kind, delivery_key, choice, done_at"
            " FROM routing_requests WHERE agent_session_id = %s ORDER BY seq",
            (agent_session,),
        ).fetchall()


def test_a_follow_up_goes_to_the_holder_in_one_statement_behind_the_start(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    start = started(pool, "user-1", "as-1")
    make_orchestrator(linear_user_id="user-1", name="desktop")  # (newer: routing's choice, not the holder's)
    key = f"d-{uuid.uuid4()}"
    routed = follow_up(pool, "as-1", delivery=key)
    assert isinstance(routed, Routed) and routed.orchestrator_id == laptop.id and routed.kind == "prompt"
    assert routed.enqueued.notice_id is None
    [first, then] = rows_of(pool, "as-1")
    assert (first["kind"], then["kind"]) == ("start", "prompt")
    assert then["orchestrator_id"] == laptop.id and then["status"] == "queued"
    assert then["seq"] > first["seq"]  # queued behind the start
    assert then["payload"]["agentSessionId"] == "as-1" and then["payload"]["kind"] == "prompt"
    assert then["payload"]["prompt"]["body"] == "more"
    assert delivery(pool, key) == {"outcome": "dispatched", "session_id": routed.enqueued.session_id}
    assert start.enqueued.session_id != routed.enqueued.session_id
    assert follow_up(pool, "as-1", delivery=key) is None  # seen before: nothing more
    assert len(rows_of(pool, "as-1")) == 2


def test_nobody_holding_it_a_follow_up_starts_the_conversation_on_the_writers_machine(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """Nobody holds the agent session (its start was cancelled, or it never had one): the follow-up
    is a `start` for the writer's machine, with Linear's "Queued for" thought. With no machine:
    recorded ignored, and Linear told why."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    bulk(pool, "INSERT INTO linear_credentials (org_id, token_encrypted) VALUES ('org-a', 'x')")
    key = f"d-{uuid.uuid4()}"
    routed = follow_up(pool, "as-new", delivery=key)
    assert isinstance(routed, Routed) and routed.orchestrator_id == laptop.id and routed.kind == "start"
    [row] = rows_of(pool, "as-new")
    assert row["kind"] == "start" and row["payload"]["kind"] == "start"
    assert row["payload"]["prompt"]["body"] == "more"
    assert delivery(pool, key) == {"outcome": "dispatched", "session_id": routed.enqueued.session_id}
    nobody = f"d-{uuid.uuid4()}"
    ignored = follow_up(pool, "as-nobody", delivery=nobody, user="user-without-a-machine")
    assert isinstance(ignored, Ignored) and ignored.reason == "no_orchestrator"
    assert delivery(pool, nobody) == {"outcome": "ignored", "session_id": None}
    with pool.connection() as conn:
        notices = conn.execute(
            "SELECT id, kind, body, agent_session_id FROM linear_notices ORDER BY seq"
        ).fetchall()
    assert [(n["kind"], n["body"], n["agent_session_id"]) for n in notices] == [
        ("dispatched", "Queued for laptop", "as-new"),
        ("failed", UNROUTABLE, "as-nobody"),
    ]
    assert routed.enqueued.notice_id == notices[0]["id"] and ignored.notice_id == notices[1]["id"]


def test_a_follow_up_behind_a_start_waiting_to_be_routed_waits_in_a_request_of_its_own(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """A start of the agent session still waiting to be routed (Linear asked first): the follow-up
    is a routing request of its own, routed after it, even though the writer has a machine. One in
    an agent session an automation started (no writer) asks Linear for the assignee."""
    make_orchestrator(linear_user_id="user-1", name="laptop")
    bulk(
        pool,
        "INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message)"
        " VALUES ('org-a', 'as-routing', 'issue-as', 'assignee', '{\"kind\": \"start\"}')",
    )
    key = f"d-{uuid.uuid4()}"
    asked = follow_up(pool, "as-routing", delivery=key)
    assert isinstance(asked, Asked)
    [_, mine] = requests_of(pool, "as-routing")
    assert mine["id"] == asked.route_id and mine["delivery_key"] == key
    assert (mine["need"], mine["linear_user_id"], mine["kind"]) == ("repository", "user-1", "prompt")
    assert delivery(pool, key) == {"outcome": "routing", "session_id": None}
    automated = follow_up(pool, "as-automated", user=None)
    assert isinstance(automated, Asked)
    [request] = requests_of(pool, "as-automated")
    assert (request["id"], request["need"], request["linear_user_id"]) == (
        automated.route_id,
        "assignee",
        None,
    )
    assert rows_of(pool, "as-routing") == [] and rows_of(pool, "as-automated") == []


def test_a_select_answers_the_question_its_agent_sessions_request_asked(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """A `select` in an agent session whose routing request asked which repository: the person's
    pick completes that request (due again at once), and nothing is queued. The same signal with
    nothing asked is a follow-up like any other."""
    make_orchestrator(linear_user_id="user-1", name="laptop")
    bulk(
        pool,
        "INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message, asked_at,"
        " available_at, linear_user_id)"
        " VALUES ('org-a', 'as-asked', 'issue-as', 'repository', '{\"kind\": \"start\"}', now(), 'infinity',"
        " 'user-1')",
    )
    [request] = requests_of(pool, "as-asked")
    key = f"d-{uuid.uuid4()}"
    answered = follow_up(pool, "as-asked", delivery=key, picked="acme/api")
    assert answered == Asked(request["id"])
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT choice, available_at <= now() AS due FROM routing_requests WHERE id = %s",
            (request["id"],),
        ).fetchone()
    assert row == {"choice": "acme/api", "due": True}
    assert delivery(pool, key) == {"outcome": "routing", "session_id": None}
    assert rows_of(pool, "as-asked") == [] and len(requests_of(pool, "as-asked")) == 1
    plain = follow_up(pool, "as-unasked", picked="acme/api")  # (nothing asked: a follow-up)
    assert isinstance(plain, Routed) and plain.kind == "start"


def test_a_follow_up_written_before_a_stop_does_nothing(pool: Pool, make_orchestrator: MakeOrch) -> None:
    make_orchestrator(linear_user_id="user-1", name="laptop")
    started(pool, "user-1", "as-stopped")
    stopped_at = datetime.now(UTC)
    bulk(
        pool,
        "INSERT INTO agent_session_stops (org_id, agent_session_id, last_stop_at)"
        " VALUES ('org-a', 'as-stopped', %(at)s)",
        {"at": stopped_at},
    )
    key = f"d-{uuid.uuid4()}"
    before = follow_up(pool, "as-stopped", delivery=key, written_at=stopped_at - timedelta(seconds=1))
    assert isinstance(before, Ignored) and before.reason == "agent_session_stopped"
    assert delivery(pool, key) == {"outcome": "ignored", "session_id": None}
    assert len(rows_of(pool, "as-stopped")) == 1
    after = follow_up(pool, "as-stopped", written_at=stopped_at + timedelta(seconds=1))
    assert isinstance(after, Routed) and after.kind == "prompt"


def test_a_follow_up_speaks_the_holders_name_and_issue(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """An agent session devpilot opened for a plain assignment: its machine knows the conversation
    by the assignment's session (`devpilot:<id>`), which the prompt carries; the queue's order and
    the session stay the agent session's. A webhook that names no issue: the holder's."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    opened = started(pool, "user-1", "as-opened")
    bulk(
        pool, "UPDATE dispatch_sessions SET agent_session_created = true WHERE agent_session_id = 'as-opened'"
    )
    routed = follow_up(pool, "as-opened", issue=None)
    assert isinstance(routed, Routed) and routed.orchestrator_id == laptop.id and routed.kind == "prompt"
    [_, then] = rows_of(pool, "as-opened")
    assert then["payload"]["agentSessionId"] == f"devpilot:{opened.enqueued.session_id}"
    assert then["payload"]["issue"]["id"] == ISSUE.id and then["payload"]["issue"]["identifier"] == "ENG-7"
    assert then["issue_id"] == ISSUE.id
    nowhere = follow_up(pool, "as-no-issue", issue=None)  # (nobody holds it, and no issue to start)
    assert isinstance(nowhere, Ignored) and nowhere.reason == "no_orchestrator"


def test_a_follow_up_waits_for_the_turn_and_finds_the_start_committed_meanwhile(
    pool: Pool, make_orchestrator: MakeOrch, db_url: str
) -> None:
    """Another transaction holds the agent session's turn and writes its start: the follow-up's
    statement waits for the turn, and its reads, taken after, find the start: a prompt behind it
    (read with the statement's own snapshot, nobody would hold it: a second start)."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    make_orchestrator(linear_user_id="user-1", name="desktop")  # (routing's choice for a new start)
    with ThreadPoolExecutor(1) as ex, connect(db_url) as watch:
        with pool.connection() as conn, transaction(conn) as tx:
            tx.execute("SELECT pg_advisory_xact_lock(devpilot_agent_session_turn_key('org-a', 'as-busy'))")
            start = DispatchPayload(issue=ISSUE, agent_session_id="as-busy", kind="start")
            enqueue_dispatch(
                tx, org_id="org-a", orchestrator_id=laptop.id, linear_user_id="user-1", message=start
            )
            waiting = ex.submit(follow_up, pool, "as-busy")
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the follow-up to wait for the turn")
        outcome = waiting.result(30)
    assert isinstance(outcome, Routed) and outcome.kind == "prompt" and outcome.orchestrator_id == laptop.id
    assert [r["kind"] for r in rows_of(pool, "as-busy")] == ["start", "prompt"]


def test_a_holder_revoked_meanwhile_writes_nothing_and_the_next_round_sees_it(
    pool: Pool, make_orchestrator: MakeOrch, db_url: str
) -> None:
    """The holder's machine is revoked while the statement waits for its row: nothing is written
    (`REVOKED`, the delivery's record included), and written again, the follow-up finds nobody
    holding the agent session and starts it on the writer's other machine."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    started(pool, "user-1", "as-1")
    desktop = make_orchestrator(linear_user_id="user-1", name="desktop")
    before = row_counts(pool)
    follow = prompted("as-1")
    locker = _lock_machine(db_url, str(laptop.id))
    try:
        with ThreadPoolExecutor(1) as ex, connect(db_url) as watch:

            def written() -> RouteOutcome:
                with statement(pool) as tx:
                    return follow_ups(tx, [follow])[0]

            waiting = ex.submit(written)
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the follow-up to wait for the machine's row")
            locker.execute("UPDATE orchestrators SET revoked_at = now() WHERE id = %s", (laptop.id,))
            locker.commit()
            assert waiting.result(30) == REVOKED
    finally:
        locker.close()
    assert row_counts(pool) == before and delivery(pool, follow.delivery_key) is None
    with statement(pool) as tx:
        [again] = follow_ups(tx, [follow])
    assert isinstance(again, Routed) and again.kind == "start" and again.orchestrator_id == desktop.id


def test_follow_ups_need_a_transaction_and_are_prompts(pool: Pool, make_orchestrator: MakeOrch) -> None:
    make_orchestrator(linear_user_id="user-1")
    started(pool, "user-1", "as-1")
    with pool.connection() as conn, pytest.raises(TypeError, match="open transaction"):
        follow_ups(conn, [prompted("as-1")])  # type: ignore[arg-type]
    start = prompted("as-1")
    start = start._replace(message=replace(start.message, kind="start"))
    with statement(pool) as tx, pytest.raises(ValueError, match="prompts"):
        follow_ups(tx, [start])
    assert row_counts(pool)["sessions"] == 1


def test_follow_ups_in_one_batch_are_each_answered_as_alone(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """Several follow-ups in one statement: each for its own holder, in order, each behind its own
    start, and one nobody holds started on its writer's machine; a copy of an earlier element's
    delivery and a second one of the same agent session get nothing written (the caller writes
    them after)."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    desktop = make_orchestrator(linear_user_id="user-2", name="desktop")
    started(pool, "user-1", "as-1")
    started(pool, "user-2", "as-2")
    one, two = prompted("as-1"), prompted("as-2", user="user-2")
    batch = [one, prompted("as-nobody"), two, one, prompted("as-2", user="user-2")]
    with statement(pool) as tx:
        out = follow_ups(tx, batch)
    assert isinstance(out[0], Routed) and out[0].orchestrator_id == laptop.id and out[0].kind == "prompt"
    assert isinstance(out[1], Routed) and out[1].orchestrator_id == laptop.id and out[1].kind == "start"
    assert isinstance(out[2], Routed) and out[2].orchestrator_id == desktop.id
    assert out[3] is None and out[4] is None
    for agent_session, machine in (("as-1", laptop.id), ("as-2", desktop.id)):
        [first, then] = rows_of(pool, agent_session)
        assert (first["kind"], then["kind"]) == ("start", "prompt") and then["seq"] > first["seq"]
        assert then["orchestrator_id"] == machine
    with pool.connection() as conn:
        keys = {r["delivery_key"] for r in conn.execute("SELECT delivery_key FROM webhook_deliveries")}
    assert {one.delivery_key, two.delivery_key, batch[1].delivery_key} <= keys
    assert batch[4].delivery_key not in keys


def test_over_http_a_follow_up_while_its_start_commits_waits_in_its_statement(
    api: Api, db_url: str, monkeypatch: pytest.MonkeyPatch, across_instances: None
) -> None:
    """Over HTTP, a follow-up that arrives (at another instance of the service) while its `created`
    is still being written (its statement holds the turn, waiting for the machine's row): the
    follow-up's statement waits for the turn, then finds the start and queues the prompt behind
    it, for the same machine (had it not waited, it would have found no holder and made a second
    start). No follow-up reaches the intake transaction."""
    laptop, token = api.register(user="user-1", name="laptop")
    transactions: list[str] = []
    real = intake._receive

    def spy(pool: Pool, hook: Any, plan: Any, key: str, content_key: str) -> Any:
        transactions.append(plan.kind)
        return real(pool, hook, plan, key, content_key)

    monkeypatch.setattr(intake, "_receive", spy)
    api.webhook(agent_session_event(session_id="as-1"))
    r = api.webhook(agent_session_event(session_id="as-1", action="prompted", body="and the docs")).json()
    assert r["status"] == "dispatched" and r["kind"] == "prompt" and r["orchestratorId"] == laptop

    locker = _lock_machine(db_url, laptop)
    try:
        with ThreadPoolExecutor(2) as ex, connect(db_url) as watch:
            created = ex.submit(api.webhook, agent_session_event(session_id="as-2"), "d-as-2")
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the start to wait on the machine's row")
            prompted_ = ex.submit(
                api.webhook, agent_session_event(session_id="as-2", action="prompted", body="more"), "d-p-2"
            )
            _wait_for(lambda: waiting_on_locks(watch) == 2, "the follow-up to wait for the turn")
            locker.commit()
            assert created.result(30).json()["kind"] == "start"
            answered = prompted_.result(30).json()
    finally:
        locker.close()
    assert transactions == []
    assert answered["status"] == "dispatched" and answered["kind"] == "prompt"
    assert answered["orchestratorId"] == laptop
    kinds = [(r["kind"], r["seq"]) for r in rows_of(api.pool, "as-2")]
    assert [k for k, _ in kinds] == ["start", "prompt"] and kinds[0][1] < kinds[1][1]
    r = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
    assert sorted((m["agentSessionId"], m["kind"]) for m in r) == [("as-1", "start"), ("as-2", "start")]
