"""A follow-up (`prompted`) in an agent session a machine holds is one statement, its own
transaction (`prompt_holder`, `prompt_holder_for_delivery`): everything else a follow-up can be is
left to the intake transaction, with nothing written. Real Postgres, real HTTP into the real app."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from shared import intake
from shared.db import Pool, connect, statement
from shared.models import DispatchPayload, IssueRef
from shared.queue import Routed, Start, prompt_holder
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


def follow_up(pool: Pool, agent_session: str, *, delivery: str | None = None) -> Routed | None:
    key = delivery or f"d-{uuid.uuid4()}"
    message = DispatchPayload(issue=ISSUE, agent_session_id=agent_session, kind="prompt")
    with statement(pool) as tx:
        return prompt_holder(
            tx,
            org_id="org-a",
            linear_user_id="user-1",
            message=message,
            delivery_key=key,
            content_key=f"c-{key}",
        )


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


def test_a_follow_up_needs_a_transaction_and_is_for_a_prompt(pool: Pool, make_orchestrator: MakeOrch) -> None:
    make_orchestrator(linear_user_id="user-1")
    started(pool, "user-1", "as-1")
    message = DispatchPayload(issue=ISSUE, agent_session_id="as-1", kind="prompt")
    with pool.connection() as conn, pytest.raises(TypeError, match="open transaction"):
        prompt_holder(
            conn,  # type: ignore[arg-type]
            org_id="org-a",
            linear_user_id="user-1",
            message=message,
            delivery_key="k",
            content_key="c",
        )
    with statement(pool) as tx, pytest.raises(ValueError, match="prompt"):
        prompt_holder(
            tx,
            org_id="org-a",
            linear_user_id="user-1",
            message=message.model_copy(update={"kind": "start"}),
            delivery_key="k",
            content_key="c",
        )
    assert row_counts(pool)["sessions"] == 1


def test_over_http_a_follow_up_for_a_holder_is_the_statement_and_one_while_its_start_commits_waits(
    api: Api, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over HTTP: a follow-up for a machine that holds its agent session is written by its one
    statement. One that arrives while its `created` is still being written (its transaction holds
    the turn, waiting for the machine's row) is not: the statement does not wait, and the intake
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
