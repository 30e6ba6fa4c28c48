"""A follow-up (`prompted`) in an agent session a machine holds is one statement, its own
transaction (`prompt_holders`, `prompt_holders_for_delivery`; several that arrive together, one
statement too): everything else a follow-up can be is
left to the intake transaction, with nothing written. Real Postgres, real HTTP into the real app."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from shared.delivery import intake
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import FollowUp, Routed, Start, prompt_holders
from shared.plumbing.db import Pool, connect, statement
from shared.wire.messages import IssueRef
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


def prompted(agent_session: str, *, delivery: str | None = None) -> FollowUp:
    key = delivery or f"d-{uuid.uuid4()}"
    message = DispatchPayload(issue=ISSUE, agent_session_id=agent_session, kind="prompt")
    return FollowUp("org-a", "user-1", message, key, f"c-{key}")


def follow_up(pool: Pool, agent_session: str, *, delivery: str | None = None) -> Routed | None:
    with statement(pool) as tx:
        [routed] = prompt_holders(tx, [prompted(agent_session, delivery=delivery)])
    return routed


def rows_of(pool: Pool, agent_session: str) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT s.kind, s.status, s.orchestrator_id, q.seq, q.payload FROM dispatch_sessions s"
            " LEFT JOIN dispatch_queue q ON q.session_id = s.id WHERE s.agent_session_id = %s"
            " ORDER BY s.created_at, q.seq",
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
    assert isinstance(routed, Routed) and routed.orchestrator_id == laptop.id
    assert routed.enqueued.notice_id is None
    [first, then] = rows_of(pool, "as-1")
    assert (first["kind"], then["kind"]) == ("start", "prompt")
    assert then["orchestrator_id"] == laptop.id and then["status"] == "queued"
    assert then["seq"] > first["seq"]  # queued behind the start
    assert then["payload"]["agentSessionId"] == "as-1" and then["payload"]["kind"] == "prompt"
    with pool.connection() as conn:
        d = conn.execute("SELECT outcome, session_id FROM webhook_deliveries WHERE delivery_key = %s", (key,))
        assert d.fetchone() == {"outcome": "dispatched", "session_id": routed.enqueued.session_id}
    assert start.enqueued.session_id != routed.enqueued.session_id
    assert follow_up(pool, "as-1", delivery=key) is None  # seen before: nothing more
    assert len(rows_of(pool, "as-1")) == 2


def test_a_follow_up_the_statement_cannot_decide_writes_nothing(
    pool: Pool, make_orchestrator: MakeOrch, db_url: str
) -> None:
    """Left to the intake transaction, with nothing written (not even the delivery): no holder (the
    transaction starts the conversation), the turn another transaction's (it waits), a holder
    revoked, and an agent session devpilot opened for a plain assignment (its machine knows it by
    another name)."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    started(pool, "user-1", "as-busy")
    started(pool, "user-1", "as-opened")
    bulk(
        pool, "UPDATE dispatch_sessions SET agent_session_created = true WHERE agent_session_id = 'as-opened'"
    )
    assert follow_up(pool, "as-nobody") is None
    holder = psycopg.connect(db_url)  # an intake transaction of as-busy, mid-flight
    holder.execute("SELECT pg_advisory_xact_lock(devpilot_agent_session_turn_key('org-a', 'as-busy'))")
    try:
        assert follow_up(pool, "as-busy") is None
    finally:
        holder.close()
    assert follow_up(pool, "as-opened") is None
    before = row_counts(pool)
    bulk(pool, "UPDATE orchestrators SET revoked_at = now() WHERE id = %(id)s", {"id": laptop.id})
    assert follow_up(pool, "as-busy") is None
    with pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM webhook_deliveries").fetchone() == {"n": 2}
    assert row_counts(pool) == before and before["sessions"] == 2


def test_follow_ups_need_a_transaction_and_are_prompts(pool: Pool, make_orchestrator: MakeOrch) -> None:
    make_orchestrator(linear_user_id="user-1")
    started(pool, "user-1", "as-1")
    with pool.connection() as conn, pytest.raises(TypeError, match="open transaction"):
        prompt_holders(conn, [prompted("as-1")])  # type: ignore[arg-type]
    start = prompted("as-1")
    start = FollowUp(start.org_id, None, replace(start.message, kind="start"), "k", "c")
    with statement(pool) as tx, pytest.raises(ValueError, match="prompts"):
        prompt_holders(tx, [start])
    assert row_counts(pool)["sessions"] == 1


def test_follow_ups_in_one_batch_are_each_answered_as_alone(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """Several follow-ups in one statement: each for its own holder, in order, each behind its own
    start; a copy of an earlier element's delivery, a second one of the same agent session and one
    with no holder get nothing written (the intake transaction decides them)."""
    laptop = make_orchestrator(linear_user_id="user-1", name="laptop")
    desktop = make_orchestrator(linear_user_id="user-2", name="desktop")
    started(pool, "user-1", "as-1")
    started(pool, "user-2", "as-2")
    one, two = prompted("as-1"), prompted("as-2")
    batch = [one, prompted("as-nobody"), two, one, prompted("as-2")]
    with statement(pool) as tx:
        out = prompt_holders(tx, batch)
    assert isinstance(out[0], Routed) and out[0].orchestrator_id == laptop.id
    assert isinstance(out[2], Routed) and out[2].orchestrator_id == desktop.id
    assert out[1] is None and out[3] is None and out[4] is None
    for agent_session, machine in (("as-1", laptop.id), ("as-2", desktop.id)):
        [first, then] = rows_of(pool, agent_session)
        assert (first["kind"], then["kind"]) == ("start", "prompt") and then["seq"] > first["seq"]
        assert then["orchestrator_id"] == machine
    with pool.connection() as conn:
        keys = {r["delivery_key"] for r in conn.execute("SELECT delivery_key FROM webhook_deliveries")}
    assert {one.delivery_key, two.delivery_key} <= keys and batch[1].delivery_key not in keys
    assert batch[4].delivery_key not in keys


def test_over_http_a_follow_up_for_a_holder_is_the_statement_and_one_while_its_start_commits_waits(
    api: Api, db_url: str, monkeypatch: pytest.MonkeyPatch, across_instances: None
) -> None:
    """Over HTTP: a follow-up for a machine that holds its agent session is written by its one
    statement. One that arrives (at another instance of the service) while its `created` is still
    being written (its one statement holds the turn, waiting for the machine's row) is not: the statement does not wait, and the intake
    transaction waits for the turn, then finds the start and queues the prompt behind it, for the
    same machine (had it not waited, it would have found no holder and made a second start)."""
    laptop, token = api.register(user="user-1", name="laptop")
    decided: list[bool] = []
    real = intake._prompt_at_once

    def spy(*args: Any) -> Any:
        got = real(*args)
        decided.append(got is not None)
        return got

    monkeypatch.setattr(intake, "_prompt_at_once", spy)
    api.webhook(agent_session_event(session_id="as-1"))
    r = api.webhook(agent_session_event(session_id="as-1", action="prompted", body="and the docs")).json()
    assert r["status"] == "dispatched" and r["kind"] == "prompt" and r["orchestratorId"] == laptop
    assert decided == [True]

    locker = _lock_machine(db_url, laptop)
    try:
        with ThreadPoolExecutor(2) as ex, connect(db_url) as watch:
            created = ex.submit(api.webhook, agent_session_event(session_id="as-2"), "d-as-2")
            _wait_for(lambda: waiting_on_locks(watch) == 1, "the start to wait on the machine's row")
            prompted = ex.submit(
                api.webhook, agent_session_event(session_id="as-2", action="prompted", body="more"), "d-p-2"
            )
            _wait_for(lambda: waiting_on_locks(watch) == 2, "the follow-up to wait for the turn")
            locker.commit()
            assert created.result(30).json()["kind"] == "start"
            answered = prompted.result(30).json()
    finally:
        locker.close()
    assert decided == [True, False]  # (the statement wrote nothing; the transaction decided)
    assert answered["status"] == "dispatched" and answered["kind"] == "prompt"
    assert answered["orchestratorId"] == laptop
    kinds = [(r["kind"], r["seq"]) for r in rows_of(api.pool, "as-2")]
    assert [k for k, _ in kinds] == ["start", "prompt"] and kinds[0][1] < kinds[1][1]
    r = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
    assert sorted((m["agentSessionId"], m["kind"]) for m in r) == [("as-1", "start"), ("as-2", "start")]
