"""The claim and the sweep skip rows another transaction holds (SKIP LOCKED): they never wait on an
ack in flight. A release that waits on a newer claim judges the newest row, not its snapshot. And a
long-poll wakes on the enqueue's NOTIFY, well before its re-check backstop, even when it starts
while the enqueue is committing. The events of one agent session wait for each other."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from shared.delivery import intake
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import (
    OVERTAKEN,
    IssueChange,
    Routed,
    Start,
    claim,
    end_claim_params,
    end_expired_claims,
    enqueue_dispatch,
    release,
    route_and_enqueue_many,
    sweep,
)
from shared.dispatch import RECHECK_SECONDS
from shared.plumbing.db import Conn, Pool, Tx, connect, statement, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.batches import assigned, change_of, changes_answered, stop_of
from tests.helpers.data import MakeOrch, enqueue_one, follow_up_in, issue, queue_of


def in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def long_poll(api: Api, token: str) -> tuple[threading.Thread, list[Any]]:
    """A 20 s long-poll in a thread; its result is (the answer, when it came)."""
    return in_thread(lambda: (api.post_as(token, "/claim", {"waitSeconds": 20}).json(), time.monotonic()))


def _blocked_by(pool: Pool, pid: int | None = None, *, count: int = 1) -> None:
    """Wait until `count` backends of this database wait on a lock (one the backend `pid` holds,
    when given): the interleaving a test holds open has begun, on any host, however slow."""
    deadline = time.monotonic() + 10
    with pool.connection() as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
                " AND cardinality(pg_blocking_pids(pid)) > 0"
                " AND (%(pid)s::int IS NULL OR %(pid)s::int = ANY(pg_blocking_pids(pid)))",
                {"pid": pid},
            ).fetchone()
            if row is not None and row["n"] >= count:
                return
            time.sleep(0.02)
    raise AssertionError(f"fewer than {count} backends waited on a lock (held by {pid or 'any'})")


def _backend_of(tx: Tx) -> int:
    """The server process of an open transaction (through a transaction-mode pooler too, where the
    connection's own backend pid is the pooler's stand-in)."""
    row = tx.one("SELECT pg_backend_pid() AS pid")
    assert row is not None
    return int(row["pid"])


def enqueue(tx: Tx, machine: str, user: str, n: int, session_id: UUID | None = None) -> None:
    """Issue n's start for a machine of org-a, in the caller's transaction."""
    enqueue_dispatch(
        tx,
        org_id="org-a",
        orchestrator_id=UUID(machine),
        linear_user_id=user,
        message=DispatchPayload(issue=issue(n)),
        session_id=session_id,
    )


def test_a_claim_skips_a_row_another_transaction_holds(
    pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    o = make_orchestrator()
    held = enqueue_one(pool, o, 1)[1].queue_id
    free = enqueue_one(pool, o, 2)[1].queue_id
    with connect(db_url, autocommit=False) as locker:
        locker.execute("SELECT id FROM dispatch_queue WHERE id = %s FOR UPDATE", (held,))  # an ack in flight
        t, out = in_thread(lambda: claim(pool, o.id, max=10, lease_seconds=60))
        t.join(timeout=3)
        assert not t.is_alive(), "the claim waited on a locked row"
        assert [m.queue_id for m in out[0]] == [free]
        locker.rollback()


def test_the_sweep_skips_a_row_another_transaction_holds(
    pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    o = make_orchestrator()
    for n in range(3):
        enqueue_one(pool, o, n)
    got = claim(pool, o.id, max=10, lease_seconds=1)
    later = datetime.now(UTC) + timedelta(seconds=5)
    with connect(db_url, autocommit=False) as locker:
        locker.execute("SELECT id FROM dispatch_queue WHERE id = %s FOR UPDATE", (got[0].queue_id,))
        t, out = in_thread(lambda: sweep(pool, Settings(), now=later))
        t.join(timeout=3)
        assert not t.is_alive(), "the sweep waited on a locked row"
        assert out[0].requeued == 2
        locker.rollback()


def test_a_release_that_waited_on_a_newer_claim_changes_nothing(
    pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """A release is a compare-and-set on its token, also when it has to wait: here a newer claim of
    the row (the sweep re-queued it and another claim took it) is committing while the old claim's
    release runs. The release locks the row and re-checks its token on the newest version, so it
    answers claim_superseded and leaves the newer claim holding the row; had it judged the row by its
    snapshot, it would re-queue work another claim holds, and a third claim could take it too."""
    o = make_orchestrator()
    enqueue_one(pool, o)
    [old] = claim(pool, o.id, max=1, lease_seconds=60)
    with connect(db_url, autocommit=False) as newer:
        row = newer.execute(
            "UPDATE dispatch_queue SET claim_token = gen_random_uuid() WHERE id = %s RETURNING claim_token",
            (old.queue_id,),
        ).fetchone()
        assert row is not None
        t, out = in_thread(lambda: release(pool, Settings(), o.id, old.queue_id, old.claim_token))
        _blocked_by(pool, newer.info.backend_pid)  # the release waits on the row
        newer.commit()
    t.join(timeout=10)
    assert out[0].status == "claim_superseded"
    with pool.connection() as conn:
        now = conn.execute(
            "SELECT claim_token, lease_expires_at FROM dispatch_queue WHERE id = %s", (old.queue_id,)
        ).fetchone()
    assert now is not None
    assert now["claim_token"] == row["claim_token"] and now["lease_expires_at"] is not None


@pytest.mark.parametrize("event", ["issue_assigned", "agent_session_created"])
def test_a_long_poll_wakes_on_the_notify_not_the_recheck(api: Api, event: str) -> None:
    """Each statement that queues a webhook's message NOTIFYs a machine that is long-polling: an
    issue's assignment, and an agent session's start (whose statement also writes Linear's first
    thought)."""
    _, token = api.register()
    t, out = long_poll(api, token)
    time.sleep(1.0)  # waiting now (its first look found nothing)
    sent_at = time.monotonic()
    hook = (
        issue_event(issue_id="wake")
        if event == "issue_assigned"
        else agent_session_event(session_id="as-wake")
    )
    assert api.webhook(hook).json()["status"] == "dispatched"
    t.join(timeout=25)
    answer, answered_at = out[0]
    assert len(answer["messages"]) == 1
    assert answered_at - sent_at < RECHECK_SECONDS / 2  # the NOTIFY, not the polling backstop


def test_a_long_poll_that_starts_while_an_enqueue_commits_is_not_left_asleep(api: Api) -> None:
    """An enqueue sends its NOTIFY only to a machine marked as long-polling. The race that rule must
    survive: the enqueue's statement has run (it read "nobody is waiting") but not committed when a
    long-poll starts. The long-poll's mark waits for that commit (the enqueue holds the machine's
    row), so its first look finds the work and it answers at once, not at the re-check."""
    oid, token = api.register()
    with transaction(api.pool) as tx:
        enqueue(tx, oid, "user-1", 1)
        t, out = long_poll(api, token)
        _blocked_by(api.pool, _backend_of(tx))  # the long-poll has begun, and waits on the machine's row
    committed_at = time.monotonic()
    t.join(timeout=25)
    answer, answered_at = out[0]
    assert len(answer["messages"]) == 1
    assert answered_at - committed_at < RECHECK_SECONDS / 2  # its first look, not the backstop


def test_an_enqueue_that_was_held_up_while_a_long_poll_began_still_wakes_it(api: Api) -> None:
    """The other order: the enqueue's statement began (its snapshot taken) before a long-poll marked
    the machine, but reads the mark only after the mark committed. Here it is held up by a
    transaction that holds its session id, on another machine, so nothing locks this machine's row.
    A plain read would see the snapshot's "nobody is waiting" and send no NOTIFY; the locking read
    sees the mark, and the long-poll wakes at the commit."""
    oid, token = api.register()
    other, _ = api.register(user="user-2")
    sid = uuid4()
    with transaction(api.pool) as holder:  # holds the session id until it rolls back
        enqueue(holder, other, "user-2", 2, session_id=sid)

        def held_up_enqueue() -> float:
            with transaction(api.pool) as tx:
                enqueue(tx, oid, "user-1", 1, session_id=sid)
            return time.monotonic()

        e, committed = in_thread(held_up_enqueue)
        _blocked_by(api.pool, _backend_of(holder))  # its statement has begun and waits on the session id
        t, out = long_poll(api, token)
        time.sleep(1.0)  # the long-poll has marked the machine, looked, found nothing, and waits
        raise psycopg.Rollback()  # the holder ends; the held-up enqueue goes on and commits
    e.join(timeout=10)
    t.join(timeout=25)
    answer, answered_at = out[0]
    assert len(answer["messages"]) == 1
    assert answered_at - committed[0] < RECHECK_SECONDS / 2  # the NOTIFY, not the backstop


def test_rerouting_skips_a_row_a_claim_holds(pool: Pool, db_url: str, make_orchestrator: MakeOrch) -> None:
    """The sweep's move of a quiet machine's work never waits on a claim taking one of its rows: it
    moves the others, and the held one stays (the claim that holds it wins)."""
    quiet = make_orchestrator(linear_user_id="u-lock")
    live = make_orchestrator(linear_user_id="u-lock")
    rows = [enqueue_one(pool, quiet, n)[1].queue_id for n in range(3)]
    with pool.connection() as conn:
        conn.execute(
            "UPDATE orchestrators SET last_seen_at = now() - make_interval(secs => %s) WHERE id = %s",
            (3600, quiet.id),
        )
        conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (live.id,))
    with connect(db_url, autocommit=False) as locker:
        locker.execute("SELECT id FROM dispatch_queue WHERE id = %s FOR UPDATE", (rows[0],))
        t, out = in_thread(lambda: sweep(pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)))
        t.join(timeout=3)
        assert not t.is_alive(), "rerouting waited on a locked row"
        assert out[0].rerouted == 2
        locker.rollback()
    assert [m.queue_id for m in claim(pool, quiet.id, max=10, lease_seconds=60)] == [rows[0]]


def test_a_poll_racing_a_revoke_never_deadlocks(api: Api, db_url: str) -> None:
    """A revoke locks the machine's row, then deletes its queue rows. A poll that is claiming one of
    those rows must not then wait for the machine's row to mark it seen: each would wait for the
    other (Postgres aborts one with a deadlock, seen once in a full-suite run of
    test_claim_racing_revoke). The poll skips the last-seen touch when the row is locked and
    finishes; the revoke's delete then takes the row it claimed."""
    oid, token = api.register()
    session = api.webhook(issue_event(issue_id="iss-revoking")).json()["sessionId"]
    with api.pool.connection() as conn:  # not seen for a while: this poll wants to touch last_seen_at
        conn.execute(
            "UPDATE orchestrators SET last_seen_at = now() - interval '1 hour' WHERE id = %s", (oid,)
        )
    with connect(db_url, autocommit=False) as revoker:
        revoker.execute(query("orchestrator_revoke"), {"id": oid})  # the revoke, open
        t, out = in_thread(
            lambda: httpx.post(
                f"{api.url}/claim", json={"max": 1}, headers={"Authorization": f"Bearer {token}"}
            )
        )
        t.join(timeout=5)
        assert not t.is_alive(), "the poll waited on the machine's row while holding a queue row"
        r = out[0]
        assert r.status_code == 200, r.text  # (its snapshot predates the revoke's commit)
        assert [m["sessionId"] for m in r.json()["messages"]] == [session]
        rest = revoker.execute(query("revoke_cancel_rest"), {"id": oid, "reason": "revoked"}).fetchone()
        assert rest is not None and rest["cancelled"] == 1  # the revoke takes the claimed row back
        revoker.commit()
    assert api.post_as(token, "/claim", {"max": 1}).status_code == 401


def _answer_once_committed(api: Api, holder: Conn, event: dict[str, Any]) -> httpx.Response:
    """The webhook `event`, sent while `holder` (a connection in an open transaction) holds a turn
    it needs: it must wait for that turn, and be answered after `holder` commits."""
    t, out = in_thread(lambda: api.webhook(event))
    _blocked_by(api.pool, holder.info.backend_pid)  # it waits for the holder's turn
    holder.commit()
    t.join(timeout=10)
    answer: httpx.Response = out[0]
    assert answer.status_code == 200, answer.text
    return answer


def test_a_revoke_waits_for_an_enqueue_to_its_machine_and_moves_that_work(api: Api) -> None:
    """An intake transaction has queued work for a machine and not yet committed when the machine
    is revoked. The revoke must not finish without that work: it waits for the enqueue's commit
    (the enqueue holds the machine's row), then moves it to the user's other machine. Were it not to
    wait, its move would look before the row existed and the row would commit afterwards on a
    machine that can never claim it: queued for ever."""
    revoked, _ = api.register(name="laptop")
    other, other_token = api.register(name="desktop")
    with transaction(api.pool) as tx:
        enqueue(tx, revoked, "user-1", 1)
        t, out = in_thread(lambda: api.http.post(f"/orchestrators/{revoked}/revoke", headers=api.admin()))
        _blocked_by(api.pool, _backend_of(tx))  # the revoke has begun and waits on the machine's row
    t.join(timeout=10)
    assert out[0].status_code == 200, out[0].text
    assert queue_of(api.pool) == [(other, "queued")]
    messages = api.post_as(other_token, "/claim", {"max": 10}).json()["messages"]
    assert [m["issue"]["id"] for m in messages] == [issue(1).id]


def _answered_across_a_revoke(api: Api, db_url: str, revoked: str, event: dict[str, Any]) -> Any:
    """`event`'s answer, sent while a revoke of `revoked` (the machine it routes to) is open: the
    webhook waits on that machine, and the revoke moves and cancels the machine's work and commits."""
    with connect(db_url, autocommit=False) as revoker:
        revoker.execute(query("orchestrator_revoke"), {"id": revoked})  # the revoke, open
        t, out = in_thread(lambda: api.webhook(event))
        _blocked_by(api.pool, revoker.info.backend_pid)  # it chose the machine being revoked, and waits
        revoker.execute(query("revoke_move_starts"), {"id": revoked})
        revoker.execute(query("revoke_cancel_rest"), {"id": revoked, "reason": "revoked"})
        revoker.commit()
    t.join(timeout=10)
    return out[0]


def test_a_webhook_held_up_by_a_revoke_routes_to_a_machine_that_stays(api: Api, db_url: str) -> None:
    """The other order: the revoke holds the machine's row when a webhook for its user routes to
    it. The webhook's enqueue waits for the revoke to commit, finds the machine revoked, and the
    intake decides again: the work goes to the user's other machine, and the webhook answers so."""
    revoked, _ = api.register(name="laptop")
    other, _ = api.register(name="desktop")
    with api.pool.connection() as conn:  # the routing choice: the machine being revoked
        conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (revoked,))
    r = _answered_across_a_revoke(api, db_url, revoked, issue_event(issue_id="iss-held"))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "dispatched" and r.json()["orchestratorId"] == other
    assert queue_of(api.pool) == [(other, "queued")]


def test_two_machines_of_one_user_revoked_at_once_hand_their_work_to_the_third(api: Api, db_url: str) -> None:
    """Each revoke moves its machine's undelivered starts to the user's most recently seen active
    machine, which may be the machine the other revoke is removing. Two such revokes at once must
    neither deadlock (each waiting for the other's machine) nor leave work on a revoked machine:
    the second waits for the first, and every start ends on the machine that stays."""
    a, _ = api.register(name="a")
    b, _ = api.register(name="b")
    c, c_token = api.register(name="c")
    with api.pool.connection() as conn:  # a and b are each other's preferred target
        for machine, ago in ((a, 1), (b, 2), (c, 3)):
            conn.execute(
                "UPDATE orchestrators SET last_seen_at = now() - make_interval(mins => %s) WHERE id = %s",
                (ago, machine),
            )
    with transaction(api.pool) as tx:
        enqueue(tx, a, "user-1", 1)
        enqueue(tx, b, "user-1", 2)
    with connect(db_url, autocommit=False) as first:
        first.execute(query("orchestrator_revoke"), {"id": a})  # a's revoke, open
        t, out = in_thread(lambda: api.http.post(f"/orchestrators/{b}/revoke", headers=api.admin()))
        _blocked_by(api.pool, first.info.backend_pid)  # b's revoke has begun, and waits on a's row
        first.execute(query("revoke_move_starts"), {"id": a})
        first.execute(query("revoke_cancel_rest"), {"id": a, "reason": "revoked"})
        first.commit()
    t.join(timeout=10)
    assert out[0].status_code == 200, out[0].text
    assert queue_of(api.pool) == [(c, "queued"), (c, "queued")]
    messages = api.post_as(c_token, "/claim", {"max": 10}).json()["messages"]
    assert sorted(m["issue"]["id"] for m in messages) == sorted([issue(1).id, issue(2).id])


def test_a_stop_waits_for_the_start_its_agent_session_is_committing(
    api: Api, db_url: str, across_instances: None
) -> None:
    """The events of one agent session are applied one at a time, in commit order. A stop that
    arrives while the session's start is still committing must wait for it and cancel it: were it
    to look first, it would find nothing to cancel, and the start would then commit after the user
    pressed stop, and run. (The stop reaches another instance of the service: the database's turn
    orders them; within one instance they also wait in arrival order, `shared.plumbing.in_order`.)"""
    machine, _ = api.register()
    with connect(db_url, autocommit=False) as holder:
        # Holds the start's enqueue (which reads its machine's row FOR KEY SHARE) mid-transaction.
        holder.execute("SELECT 1 FROM orchestrators WHERE id = %s FOR UPDATE", (machine,))
        start_t, start = in_thread(lambda: api.webhook(agent_session_event(session_id="as-held")))
        # The start has recorded its delivery, and waits on the machine's row.
        _blocked_by(api.pool, holder.info.backend_pid)
        stop_t, stop = in_thread(
            lambda: api.webhook(agent_session_event(session_id="as-held", action="prompted", signal="stop"))
        )
        _blocked_by(api.pool, count=2)  # the stop has begun, and waits on the start
        holder.rollback()
    start_t.join(timeout=10)
    stop_t.join(timeout=10)
    assert start[0].status_code == 200 and start[0].json()["status"] == "dispatched", start[0].text
    assert stop[0].status_code == 200, stop[0].text
    assert stop[0].json()["cancelledSessionIds"] == [start[0].json()["sessionId"]]
    assert queue_of(api.pool) == []


def test_a_created_waiting_behind_its_stop_sees_the_stop(
    api: Api, db_url: str, across_instances: None
) -> None:
    """The reverse order: the stop's transaction has the agent session's turn (it found nothing to
    stop) when the `created` arrives, at another instance. The `created`'s one statement waits for
    the turn, and must then see the stop that committed meanwhile, although the statement began
    before that commit: it starts nothing. (Its check reads with a snapshot taken after the turn,
    `devpilot_agent_session_seen`; a check in the statement's own snapshot would miss the stop.)"""
    api.register(user="user-1")
    with connect(db_url, autocommit=False) as stop:
        stop.execute(query("agent_session_turn_alone"), {"org_id": "org-a", "agent_session_id": "as-stopped"})
        stop.execute(
            query("record_stop"),
            {"batch": Jsonb([{"org_id": "org-a", "agent_session_id": "as-stopped", "at": None, "n": None}])},
        )
        late = _answer_once_committed(api, stop, agent_session_event(session_id="as-stopped"))
    assert late.json() == {"status": "ignored", "reason": "agent_session_stopped"}
    assert queue_of(api.pool) == []
    with api.pool.connection() as conn:
        written = conn.execute(
            "SELECT count(*) AS n FROM dispatch_sessions WHERE agent_session_id = 'as-stopped'"
        ).fetchone()
    assert written is not None and written["n"] == 0


def test_a_follow_up_waiting_behind_a_later_stop_sees_the_stop(
    api: Api, db_url: str, across_instances: None
) -> None:
    """A follow-up the person wrote before pressing stop arrives, at another instance, while the
    stop's transaction has the agent session's turn. It waits for the turn and must then see the
    stop that committed meanwhile, though it began before that commit: it does nothing. (Its check
    reads with a snapshot taken after the turn, `devpilot_agent_session_stopped_since`.)"""
    api.register(user="user-1")
    start = api.webhook(agent_session_event(session_id="as-stopping")).json()
    written = agent_session_event(session_id="as-stopping", action="prompted", body="and then?")
    with connect(db_url, autocommit=False) as stop:
        stop.execute(
            query("agent_session_turn_alone"), {"org_id": "org-a", "agent_session_id": "as-stopping"}
        )
        stop.execute(
            query("record_stop"),
            {
                "batch": Jsonb(
                    [
                        {
                            "org_id": "org-a",
                            "agent_session_id": "as-stopping",
                            "at": datetime.now(UTC).isoformat(),
                        }
                    ]
                )
            },
        )
        stop.execute("UPDATE dispatch_sessions SET status = 'cancelled' WHERE id = %s", (start["sessionId"],))
        stop.execute("DELETE FROM dispatch_queue WHERE session_id = %s", (start["sessionId"],))
        late = _answer_once_committed(api, stop, written)
    assert late.json() == {"status": "ignored", "reason": "agent_session_stopped"}
    assert queue_of(api.pool) == []


def test_an_older_assignment_waiting_behind_a_later_change_sees_it(
    api: Api, db_url: str, across_instances: None
) -> None:
    """A later change of the issue (unassigned) is committing, holding the issue's turn, when a
    retry of an older assignment arrives at another instance. The retry waits for the turn and must
    then see the later change, though it began before that commit: it does nothing."""
    api.register(user="user-1")
    older = issue_event(issue_id="i-held", assignee="user-1")
    later = issue_event("update", issue_id="i-held", assignee=None, updated_from={"assigneeId": "user-1"})
    with connect(db_url, autocommit=False) as change:
        change.execute("SELECT pg_advisory_xact_lock(devpilot_issue_turn_key('org-a', 'i-held'))")
        change.execute(
            "INSERT INTO webhook_deliveries (delivery_key, content_key, org_id, issue_id, event_at)"
            " VALUES ('later', 'later', 'org-a', 'i-held', %s)",
            (later["data"]["updatedAt"],),
        )
        retry = _answer_once_committed(api, change, older)
    assert retry.json() == {"status": "ignored", "reason": "assignment_superseded"}
    assert queue_of(api.pool) == []


def test_a_reassignment_held_up_by_a_revoke_routes_to_a_machine_that_stays(api: Api, db_url: str) -> None:
    """A re-assignment's statements are sent at once, so nothing is looked at between them: when its
    enqueue waits for a revoke of the machine it chose and finds it revoked, the statement aborts
    the transaction (nothing commits, the delivery's record neither) and the intake decides again:
    the start goes to the assignee's other machine, and the webhook answers so."""
    revoked, _ = api.register(name="laptop")
    other, _ = api.register(name="desktop")
    with api.pool.connection() as conn:  # the routing choice: the machine being revoked
        conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (revoked,))
    event = issue_event(
        "update", issue_id="iss-re-held", assignee="user-1", updated_from={"assigneeId": "user-2"}
    )
    r = _answered_across_a_revoke(api, db_url, revoked, event)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "dispatched" and r.json()["orchestratorId"] == other
    assert queue_of(api.pool) == [(other, "queued")]
    with api.pool.connection() as conn:
        [row] = conn.execute("SELECT outcome, session_id FROM webhook_deliveries").fetchall()
    assert row == {"outcome": "dispatched", "session_id": UUID(r.json()["sessionId"])}


@pytest.mark.parametrize("batch", ["cancel_then_start", "two_cancels"])
def test_a_batch_of_assignment_changes_racing_a_revoke_never_deadlocks(
    batch: str, api: Api, db_url: str
) -> None:
    """Assignment changes that arrive together are one statement, its own transaction. A revoke holds its machine's row, then locks the machine's queue rows in
    queue order (seq). Were the batch to take a row of that machine and then wait for the revoke,
    for the machine's row (a later change's start to it: `cancel_then_start`) or for another of its
    rows (an earlier row that a later change cancels: `two_cancels`), each would wait for the other
    and Postgres would abort one (the webhooks late, or the operator's revoke answered 503). The
    batch takes the machines it touches before any queue row: it waits for the revoke holding none,
    the revoke cancels the machine's work and commits, and the batch then finds it gone.
    (In `two_cancels`, the revoke's hold on the earlier row is a lock its transaction takes before
    its statement.)"""
    machine, _ = api.register(user="user-1")
    # iss-b's dispatch first (the earlier row), then iss-a's: the batch cancels iss-a's row first
    sessions = {i: api.webhook(issue_event(issue_id=i)).json()["sessionId"] for i in ("iss-b", "iss-a")}
    changes = [change_of(assigned("iss-a", None, "user-1"), "d-un-a")]
    if batch == "cancel_then_start":  # iss-c re-assigned to user-1: a start for the same machine
        changes.append(change_of(assigned("iss-c", "user-1", "user-2"), "d-re-c"))
    else:
        changes.append(change_of(assigned("iss-b", None, "user-1"), "d-un-b"))

    def written() -> Any:
        try:
            return changes_answered(api.pool, changes)
        except Exception as error:  # (what the batch raised, to look at here)
            return error

    with connect(db_url, autocommit=False) as revoker:
        revoker.execute(query("orchestrator_revoke"), {"id": machine})  # the revoke, open
        if batch == "two_cancels":
            revoker.execute(
                "SELECT 1 FROM dispatch_queue WHERE session_id = %s FOR UPDATE", (sessions["iss-b"],)
            )
        t, out = in_thread(written)
        _blocked_by(api.pool, revoker.info.backend_pid)  # the batch waits for the revoke
        revoker.execute(query("revoke_move_starts"), {"id": machine})
        rest = revoker.execute(query("revoke_cancel_rest"), {"id": machine, "reason": "revoked"}).fetchone()
        revoker.commit()
    t.join(timeout=10)
    assert rest is not None and rest["cancelled"] == 2  # both dispatches, by the revoke
    if batch == "cancel_then_start":
        # The start finds its machine revoked: nothing is written for it (not its delivery either),
        # and its caller writes it again; the cancel finds its row gone with the revoke.
        assert isinstance(out[0], list), out[0]
        answers = [r.answer if r is not None else None for r in out[0]]
        assert answers == [{"status": "ignored", "reason": "nothing_to_cancel"}, None], out[0]
        with api.pool.connection() as conn:
            recorded = conn.execute(
                "SELECT delivery_key FROM webhook_deliveries WHERE delivery_key LIKE 'delivery:d-%'"
            ).fetchall()
        assert recorded == [{"delivery_key": "delivery:d-un-a"}]
    else:
        assert isinstance(out[0], list), out[0]
        answers = [r.answer if r is not None else None for r in out[0]]
        assert answers == [{"status": "ignored", "reason": "nothing_to_cancel"}] * 2, out[0]
    assert queue_of(api.pool) == []


def test_two_batches_of_changes_of_the_same_issues_never_wait_for_each_other_in_a_circle(
    api: Api, db_url: str
) -> None:
    """Two batches of assignment changes of the same two issues, listed in opposite orders, each one
    transaction that holds every issue's turn it takes to its commit. Each takes its turns in the
    order of the turns' keys, whatever the order of its changes. Were a batch to take them in the
    order given, the first (`hi`, then `lo`) would get `hi` once another transaction let go of it,
    while the second held `lo` and waited for `hi`: each would wait for the other, and Postgres
    would abort one (its webhooks answered 500, late)."""
    api.register(user="user-1")
    with api.pool.connection() as conn:
        keys = {
            i: conn.execute("SELECT devpilot_issue_turn_key('org-a', %s) AS k", (i,)).fetchone()["k"]  # type: ignore[index]
            for i in ("iss-a", "iss-b")
        }
    lo, hi = sorted(keys, key=keys.__getitem__)
    first = [change_of(assigned(i, None, "user-1"), f"d-1-{i}") for i in (hi, lo)]
    second = [change_of(assigned(i, None, "user-1"), f"d-2-{i}") for i in (lo, hi)]

    def written(changes: list[IssueChange]) -> Any:
        try:
            return changes_answered(api.pool, changes)
        except Exception as error:  # (what the batch raised, to look at here)
            return error

    with connect(db_url, autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (keys[hi],))  # `hi`'s turn, held
        t1, out1 = in_thread(lambda: written(first))
        _blocked_by(api.pool, holder.info.backend_pid)
        t2, out2 = in_thread(lambda: written(second))
        _blocked_by(api.pool, count=2)  # both batches wait
        holder.rollback()
    t1.join(timeout=10)
    t2.join(timeout=10)
    for out in (out1, out2):
        assert isinstance(out[0], list), out[0]
        assert [r.answer["status"] if r is not None else None for r in out[0]] == ["ignored"] * 2


def test_two_batches_of_starts_of_the_same_issues_never_wait_for_each_other_in_a_circle(
    api: Api, db_url: str
) -> None:
    """The same for the issues' starts' one statement, which waits for each issue's turn: two
    batches of starts of the same two issues, listed in opposite orders, each take the turns in the
    order of their keys. The first written dispatches both; the second, its snapshot older than
    the first's commit, cannot cancel those starts and writes nothing (`OVERTAKEN`); written again,
    it cancels them and dispatches: one start of each issue is left."""
    api.register(user="user-1")
    with api.pool.connection() as conn:
        keys = {
            i: conn.execute("SELECT devpilot_issue_turn_key('org-a', %s) AS k", (issue(i).id,)).fetchone()[
                "k"
            ]  # type: ignore[index]
            for i in (1, 2)
        }
    lo, hi = sorted(keys, key=keys.__getitem__)

    def starts(order: tuple[int, int], tag: str) -> list[Start]:
        return [
            Start("org-a", "user-1", DispatchPayload(issue=issue(i)), f"{tag}-{i}", f"c-{tag}-{i}")
            for i in order
        ]

    def written(batch: list[Start]) -> Any:
        try:
            with statement(api.pool) as tx:
                return route_and_enqueue_many(tx, batch)
        except Exception as error:  # (what the statement raised, to look at here)
            return error

    with connect(db_url, autocommit=False) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (keys[hi],))  # `hi`'s turn, held
        t1, out1 = in_thread(lambda: written(starts((hi, lo), "first")))
        _blocked_by(api.pool, holder.info.backend_pid)
        t2, out2 = in_thread(lambda: written(starts((lo, hi), "second")))
        _blocked_by(api.pool, count=2)  # both batches wait
        holder.rollback()
    t1.join(timeout=10)
    t2.join(timeout=10)
    outcomes = [out1[0], out2[0]]
    assert all(isinstance(o, list) for o in outcomes), outcomes
    assert sorted(sum(isinstance(r, Routed) for r in o) for o in outcomes) == [0, 2], outcomes
    later = starts((hi, lo), "first") if OVERTAKEN in out1[0] else starts((lo, hi), "second")
    assert OVERTAKEN in outcomes[0] + outcomes[1]
    again = written(later)
    assert isinstance(again, list) and all(isinstance(r, Routed) for r in again), again
    assert len(queue_of(api.pool)) == 2  # (one start of each issue, the later batch's)


def test_a_webhook_whose_every_choice_is_revoked_meanwhile_answers_503_and_writes_nothing(
    api: Api, db_url: str
) -> None:
    """Each round of the intake routes to the user's most recently seen machine; a revoke that
    commits while the round waits on that machine's row sends it round again. When every round's
    choice is revoked so (three in a row), the webhook must not answer 500: nothing is written, it
    answers 503 with Retry-After, and Linear's retry of the same delivery is then decided afresh.
    (Real revokes of one user's machines take turns, so each would begin after the one before
    committed; here each machine's revoke is open from the start, so every round is sure to meet one.)"""
    machines = [api.register(name=f"m{i}")[0] for i in range(3)]
    with api.pool.connection() as conn:  # routing prefers m0, then m1, then m2
        for ago, machine in enumerate(machines):
            conn.execute(
                "UPDATE orchestrators SET last_seen_at = now() - make_interval(mins => %s) WHERE id = %s",
                (ago, machine),
            )
    event = issue_event(issue_id="iss-every-choice-revoked")
    revokers = [connect(db_url, autocommit=False) for _ in machines]
    try:
        for revoker, machine in zip(revokers, machines, strict=True):
            # (FOR UPDATE first, as the real revoke does: an enqueue's FOR KEY SHARE waits for that
            # lock only, not for the UPDATE's own weaker one)
            revoker.execute("SELECT 1 FROM orchestrators WHERE id = %s FOR UPDATE", (machine,))
            revoker.execute("UPDATE orchestrators SET revoked_at = now() WHERE id = %s", (machine,))
        t, out = in_thread(lambda: api.webhook(event, delivery="delivery-every-choice-revoked"))
        for revoker in revokers:
            _blocked_by(api.pool, revoker.info.backend_pid)  # this round chose this machine, and waits
            revoker.commit()
    finally:
        for revoker in revokers:
            revoker.close()
    t.join(timeout=10)
    r = out[0]
    assert r.status_code == 503, r.text
    assert r.json()["error"] == "try_again" and r.headers["Retry-After"], r.text
    with api.pool.connection() as conn:
        written = conn.execute(
            "SELECT (SELECT count(*) FROM webhook_deliveries) AS d, (SELECT count(*) FROM dispatch_sessions) AS s"
        ).fetchone()
    assert written == {"d": 0, "s": 0}
    again = api.webhook(event, delivery="delivery-every-choice-revoked")
    assert again.json() == {"status": "ignored", "reason": "no_orchestrator"}, again.text


@pytest.mark.parametrize("racer", ["stop", "revoke", "revoke_to_another_machine"])
def test_a_stop_or_revoke_racing_the_sweep_that_dead_letters_a_start_never_deadlocks(
    racer: str, api: Api, db_url: str
) -> None:
    """The sweep, dead-lettering an agent session's start at the attempt limit, holds the start's
    row and then deletes the messages queued behind it. A stop deletes every undelivered message of
    the agent session; a revoke moves (to the user's other machine) or cancels every message of the
    machine. Were either to take a later message's row first (the order a scan meets them in: a row
    can sit in space freed before the start's), each would wait for the other, and Postgres would
    abort one. They take the rows in queue order (seq), so they wait for the start's row holding
    nothing the sweep needs; the sweep finishes, and they after it, finding those rows gone.
    (Here the sweep's hold on the start is a lock its transaction takes before the sweep runs.)"""
    machine, _ = api.register(name="laptop")
    if racer == "revoke_to_another_machine":
        api.register(name="desktop")
    with api.pool.connection() as conn:  # webhooks route to the laptop
        conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (machine,))
    filler = api.webhook(issue_event(issue_id="iss-filler")).json()["sessionId"]
    start = api.webhook(agent_session_event(session_id="as-race")).json()["sessionId"]
    assert api.webhook(issue_event("remove", issue_id="iss-filler")).json()["sessionId"] == filler
    with connect(db_url) as conn:
        conn.execute("VACUUM dispatch_queue")  # the filler's slot, before the start's, is free again
    follow_up = api.webhook(agent_session_event(session_id="as-race", action="prompted", body="and then?"))
    prompt = follow_up.json()["sessionId"]
    with api.pool.connection() as conn:
        conn.execute(  # the start was claimed for the last time, and its lease ran out
            "UPDATE dispatch_queue SET attempts = %s, claim_token = gen_random_uuid(),"
            " claimed_at = now() - interval '2 hours', lease_expires_at = now() - interval '1 hour'"
            " WHERE session_id = %s",
            (api.settings.max_attempts, start),
        )
        order = [
            r["session_id"] for r in conn.execute("SELECT session_id::text FROM dispatch_queue ORDER BY ctid")
        ]
    assert order == [prompt, start], "the follow-up's row must lie before the start's"
    with connect(db_url, autocommit=False) as sweeper:
        sweeper.execute("SELECT 1 FROM dispatch_queue WHERE session_id = %s FOR UPDATE", (start,))
        if racer == "stop":
            stop = agent_session_event(session_id="as-race", action="prompted", signal="stop")
            t, out = in_thread(lambda: api.webhook(stop))
        else:
            t, out = in_thread(lambda: api.http.post(f"/orchestrators/{machine}/revoke", headers=api.admin()))
        _blocked_by(api.pool, sweeper.info.backend_pid)  # it waits for the start's row
        with transaction(sweeper) as tx:  # (a savepoint in the sweeper's transaction)
            swept = end_expired_claims(tx, {"batch": 10, **end_claim_params(api.settings)}, [])
        sweeper.commit()
    t.join(timeout=10)
    assert out[0].status_code == 200, out[0].text
    if racer == "stop":
        # The stop holds the agent session's turn: the sweep leaves the start to it, which stops
        # the start and the follow-up, having waited for the start's row.
        assert (swept.picked, swept.dead_lettered, len(swept.passed)) == (1, 0, 1)
        assert out[0].json()["status"] == "stopped"
    else:
        assert (swept.picked, swept.dead_lettered, swept.passed) == (1, 1, [])
        assert out[0].json()["moved"] == out[0].json()["cancelled"] == 0
    assert queue_of(api.pool) == []


@pytest.mark.parametrize("ended_by", ["sweep", "release"])
def test_a_follow_up_committing_while_its_start_is_dead_lettered_fails_with_it(
    api: Api, ended_by: str
) -> None:
    """A start's last delivery attempt ends without an ack (its lease expires, or the machine
    releases it), and a follow-up of its agent session is being written at that moment: its
    transaction holds the agent session's turn and has queued the prompt for the machine, which
    holds the conversation. The start must not be dead-lettered without it: the machine would
    later get a prompt of a conversation it never started. The sweep leaves that start to its next
    run; the release waits for the turn. Either then fails the follow-up with its start."""
    oid, _ = api.register(user="user-1")
    start = api.webhook(agent_session_event(session_id="as-late")).json()["sessionId"]
    later = datetime.now(UTC)
    for attempt in range(1, api.settings.max_attempts + 1):  # claimed, never acked
        later += timedelta(hours=1)
        [m] = claim(api.pool, UUID(oid), max=10, lease_seconds=60, now=later)
        assert m.session_id == UUID(start)
        if attempt < api.settings.max_attempts:
            sweep(api.pool, api.settings, now=later + timedelta(minutes=2))
    expired = later + timedelta(minutes=2)
    with transaction(api.pool) as follow_up:
        prompt = follow_up_in(follow_up, "as-late", oid)
        if ended_by == "sweep":
            assert sweep(api.pool, api.settings, now=expired).dead_lettered == 0
        else:
            t, out = in_thread(
                lambda: release(
                    api.pool, api.settings, UUID(oid), m.queue_id, m.claim_token, reason="crashed"
                )
            )
            held_by = follow_up.one("SELECT pg_backend_pid() AS pid")  # (the server's, behind a pooler too)
            assert held_by is not None
            _blocked_by(api.pool, held_by["pid"])  # it waits for the turn
    if ended_by == "sweep":
        assert sweep(api.pool, api.settings, now=expired).dead_lettered == 1
    else:
        t.join(timeout=10)
        assert out[0].dead_lettered
    assert queue_of(api.pool) == []
    with api.pool.connection() as conn:
        rows = conn.execute("SELECT id, status FROM dispatch_sessions").fetchall()
    assert {r["id"]: r["status"] for r in rows} == {UUID(start): "failed", prompt.session_id: "failed"}


def test_the_sweep_passes_over_a_start_whose_turn_is_held_and_sweeps_the_rest(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start at the attempt limit whose agent session's turn another transaction holds is left to
    the next sweep. The sweep goes on with the other expired claims, batch after batch (here of
    one), and ends: it never picks the passed-over start again in the same run."""
    from shared.delivery import queue

    monkeypatch.setattr(queue, "SWEEP_BATCH", 1)
    api.register(user="user-1")
    held = api.webhook(agent_session_event(session_id="as-held")).json()["sessionId"]
    others = [api.webhook(issue_event(issue_id=f"iss-{n}")).json()["sessionId"] for n in range(2)]
    with api.pool.connection() as conn:  # claimed and expired: the held start first, at the limit
        for n, (sid, attempts) in enumerate([(held, api.settings.max_attempts), *((o, 1) for o in others)]):
            conn.execute(
                "UPDATE dispatch_queue SET attempts = %s, claim_token = gen_random_uuid(),"
                " claimed_at = now() - interval '2 hours',"
                " lease_expires_at = now() - interval '1 hour' + make_interval(secs => %s)"
                " WHERE session_id = %s",
                (attempts, n, sid),
            )
    with transaction(api.pool) as holder:  # (as a follow-up's intake transaction, mid-way)
        holder.execute(query("agent_session_turn_alone"), {"org_id": "org-a", "agent_session_id": "as-held"})
        t, out = in_thread(lambda: sweep(api.pool, api.settings))
        t.join(timeout=10)
        assert not t.is_alive(), "the sweep kept picking the start whose turn is held"
    assert (out[0].requeued, out[0].dead_lettered) == (2, 0)
    assert sweep(api.pool, api.settings).dead_lettered == 1  # the turn free again: the next sweep


@pytest.mark.parametrize("action", ["cancel", "move"])
def test_a_follow_up_committing_while_an_operator_cancels_or_moves_its_start_goes_with_it(
    api: Api, action: str
) -> None:
    """An operator cancels a queued start from its page, or moves it to the user's other machine,
    while a follow-up of its agent session is being written: its transaction holds the agent
    session's turn and has queued the prompt for the start's machine. The action waits for the turn,
    then takes the follow-up with the start: cancelled with it, or moved with it. Without the turn,
    the follow-up stayed behind: a prompt of a conversation no machine started, or on the machine
    the conversation left."""
    laptop, _ = api.register(user="user-1", name="laptop")
    start = api.webhook(agent_session_event(session_id="as-operated")).json()
    assert start["orchestratorId"] == laptop
    desktop, _ = api.register(user="user-1", name="desktop")
    path = f"/sessions/{start['sessionId']}/{action}"
    body = {"orchestratorId": desktop} if action == "move" else None
    with transaction(api.pool) as follow_up:
        follow_up_in(follow_up, "as-operated", laptop)
        t, out = in_thread(lambda: api.http.post(path, json=body, headers=api.admin()))
        held_by = follow_up.one("SELECT pg_backend_pid() AS pid")  # (the server's, behind a pooler too)
        assert held_by is not None
        _blocked_by(api.pool, held_by["pid"])  # the operator's action waits for the turn
    t.join(timeout=10)
    assert out[0].status_code == 200, out[0].text
    if action == "cancel":
        assert queue_of(api.pool) == []
    else:
        assert queue_of(api.pool) == [(desktop, "queued"), (desktop, "queued")]


def test_an_operators_cancel_racing_the_ack_of_its_start_never_deadlocks(api: Api) -> None:
    """An operator cancels a start from its page while its machine acks it. The ack locks the
    queue row and then the session's; the operator's action takes them in the same order (the
    queue row first), so the ack waits for it, holding nothing it needs, and then finds the start
    cancelled. Taken the other way round, each waited for the other and Postgres aborted one (the
    ack answered 503, or the operator's action failed)."""
    from shared.operators.sessions import _locked

    oid, token = api.register(user="user-1")
    sid = api.webhook(agent_session_event(session_id="as-acked")).json()["sessionId"]
    [m] = claim(api.pool, UUID(oid), max=1, lease_seconds=60)
    ack = {"queueId": str(m.queue_id), "claimToken": str(m.claim_token)}
    with transaction(api.pool) as op:  # (the operator's cancel, paused before its statement)
        _locked(op, UUID(sid), turn=True)
        t, out = in_thread(lambda: api.post_as(token, "/ack", ack))
        _blocked_by(api.pool, _backend_of(op))  # the ack waits for the operator
        row = op.one(query("session_cancel"), {"id": sid, "reason": "cancelled by an operator"})
    t.join(timeout=10)
    assert row is not None and row["cancelled"] == 1
    assert out[0].status_code < 500, out[0].text
    assert queue_of(api.pool) == []


def _dead_letter(api: Api, machine: str) -> None:
    """The machine gives back what is queued for it, each time after the backoff, until it is
    dead-lettered."""
    later = datetime.now(UTC)
    while queue_of(api.pool):
        later += timedelta(hours=1)
        [m] = claim(api.pool, UUID(machine), max=1, lease_seconds=60, now=later)
        release(api.pool, api.settings, UUID(machine), m.queue_id, m.claim_token, reason="crashed", now=later)


def test_an_operators_retry_waits_for_a_follow_up_that_starts_the_conversation_afresh(api: Api) -> None:
    """A start was dead-lettered. An operator retries it from its page while a follow-up of its
    agent session is being written: no machine has the conversation, so the follow-up's
    transaction, holding the agent session's turn, has queued a start afresh. The retry waits for
    the turn, then sees that start and is refused. Without the turn it read before that commit,
    and the conversation was started twice."""
    laptop, _ = api.register(user="user-1", name="laptop")
    start = api.webhook(agent_session_event(session_id="as-retried")).json()
    _dead_letter(api, laptop)
    with transaction(api.pool) as follow_up:
        follow_up_in(follow_up, "as-retried", laptop, "start")
        path = f"/sessions/{start['sessionId']}/retry"
        t, out = in_thread(lambda: api.http.post(path, headers=api.admin()))
        _blocked_by(api.pool, _backend_of(follow_up))  # the retry waits for the turn
    t.join(timeout=10)
    assert out[0].status_code == 409, out[0].text
    assert queue_of(api.pool) == [(laptop, "queued")]  # the follow-up's start alone


def test_a_start_made_after_a_stop_is_retried_whatever_its_transaction_began(api: Api) -> None:
    """The turn orders a stop and a retry, not the clocks of their transactions. A follow-up's
    intake transaction began before a stop's (at another instance) but took the turn after the stop
    committed: it started the conversation afresh, after the stop. When that start fails, its
    retry is not refused as stopped: only the dead letters the stop found were marked."""
    laptop, _ = api.register(user="user-1", name="laptop")
    first = api.webhook(agent_session_event(session_id="as-clock")).json()
    _dead_letter(api, laptop)
    with transaction(api.pool) as follow_up:
        follow_up.one("SELECT now()")  # (its transaction has begun: its now() is before the stop's)
        stop = api.webhook(agent_session_event(session_id="as-clock", action="prompted", signal="stop"))
        assert stop.status_code == 200, stop.text
        made = follow_up_in(follow_up, "as-clock", laptop, "start")
    _dead_letter(api, laptop)
    assert api.http.post(f"/sessions/{first['sessionId']}/retry", headers=api.admin()).status_code == 409
    again = api.http.post(f"/sessions/{made.session_id}/retry", headers=api.admin())
    assert again.status_code == 200, again.text
    assert queue_of(api.pool) == [(laptop, "queued")]


def _follow_up_at_its_last_attempt(api: Api, agent_session: str) -> tuple[str, dict[str, Any], Any, datetime]:
    """A conversation a machine has (its start delivered), and a follow-up in it given back until
    its last attempt, claimed: the machine, the follow-up's answer, its claim, and the claim's time."""
    laptop, token = api.register(user="user-1", name="laptop")
    api.webhook(agent_session_event(session_id=agent_session))
    [s] = api.post_as(token, "/claim").json()["messages"]
    assert (
        api.post_as(token, "/ack", {"queueId": s["queueId"], "claimToken": s["claimToken"]}).status_code
        == 200
    )
    body = agent_session_event(session_id=agent_session, action="prompted", body="and also?")
    f: dict[str, Any] = api.webhook(body).json()
    later = datetime.now(UTC)
    for _ in range(api.settings.max_attempts - 1):
        later += timedelta(hours=1)
        [m] = claim(api.pool, UUID(laptop), max=1, lease_seconds=60, now=later)
        release(api.pool, api.settings, UUID(laptop), m.queue_id, m.claim_token, reason="crashed", now=later)
    later += timedelta(hours=1)
    [m] = claim(api.pool, UUID(laptop), max=1, lease_seconds=60, now=later)
    return laptop, f, m, later


def test_a_follow_up_dead_lettered_while_a_stop_is_handled_is_marked_stopped(api: Api) -> None:
    """A follow-up's last release dead-letters it (without the agent session's turn: only a start's
    takes it) while the person's stop is handled. The stop's cancel waits for the release's row,
    and the stop's mark, written after the cancel, sees the dead letter: its retry is refused. Marked
    before the cancel, the dead letter was missed, and the retry resumed stopped work."""
    laptop, f, m, later = _follow_up_at_its_last_attempt(api, "as-race")
    stop = agent_session_event(session_id="as-race", action="prompted", signal="stop")
    with transaction(api.pool) as last:  # the last release, not yet committed
        params = {
            "queue_id": m.queue_id,
            "orchestrator_id": UUID(laptop),
            "claim_token": m.claim_token,
            "reason": "crashed",
            **end_claim_params(api.settings, later),
        }
        assert last.one(query("release_peek"), params) is None  # (a follow-up: no turn taken)
        released = last.one(query("release"), params)
        assert released is not None and released["failed"]
        t, out = in_thread(lambda: api.webhook(stop))
        _blocked_by(api.pool, _backend_of(last))  # the stop's cancel waits for the row
    t.join(timeout=15)
    assert out[0].status_code == 200, out[0].text
    r = api.http.post(f"/sessions/{f['sessionId']}/retry", headers=api.admin())
    assert r.status_code == 409 and "stopped in Linear" in r.json()["detail"], r.text


@pytest.mark.parametrize("upgraded", [False, True])
def test_a_follow_up_dead_lettered_while_a_stop_waits_for_its_turn_is_marked_stopped(
    api: Api, upgraded: bool
) -> None:
    """The stop's transaction began, and waits for the agent session's turn, when a follow-up's
    last release (which takes no turn) commits its dead letter: the dead letter's time is after the
    stop's. The stop's mark sees it all the same; and so does migration 0017's, for a database whose
    stops and dead letters were written before it (`upgraded`: the schema before 0017 with this
    data, then 0017), which has only the times to go by."""
    laptop, f, m, later = _follow_up_at_its_last_attempt(api, "as-waits")
    stop = agent_session_event(session_id="as-waits", action="prompted", signal="stop")
    with transaction(api.pool) as turn:  # (another event of the agent session, holding its turn)
        turn.execute(query("agent_session_turn_alone"), {"org_id": "org-a", "agent_session_id": "as-waits"})
        t, out = in_thread(lambda: api.webhook(stop))
        _blocked_by(api.pool, _backend_of(turn))  # the stop's transaction has begun, and waits
        release(api.pool, api.settings, UUID(laptop), m.queue_id, m.claim_token, reason="crashed", now=later)
    t.join(timeout=15)
    assert out[0].status_code == 200, out[0].text
    if upgraded:
        migration = Path(__file__).parent.parent / "infra" / "migrations" / "0017_stopped_dead_letters.sql"
        with transaction(api.pool) as tx:
            tx.execute("ALTER TABLE dead_letters DROP COLUMN stopped_at")
            tx.execute(migration.read_text())
    r = api.http.post(f"/sessions/{f['sessionId']}/retry", headers=api.admin())
    assert r.status_code == 409 and "stopped in Linear" in r.json()["detail"], r.text


def test_a_stop_racing_a_revoke_of_the_machine_that_has_the_conversation_never_deadlocks(
    api: Api, db_url: str
) -> None:
    """A stop for a conversation a machine has cancels the follow-up still queued for that machine
    and queues a `stop` for it (an enqueue: it waits for a revoke holding the machine's row). The
    revoke, holding the machine's row, cancels every message of the machine, the follow-up among
    them. Were the stop to cancel first and then wait for the machine, each would wait for the
    other. The stop takes the machine's row before it cancels anything: it waits for the revoke,
    which cancels the follow-up and commits; the stop then finds no machine with the conversation,
    queues nothing, and nothing is left on the revoked machine."""
    machine, token = api.register()
    api.webhook(agent_session_event(session_id="as-revoked"))
    [start] = api.post_as(token, "/claim", {"max": 10}).json()["messages"]
    assert (
        api.post_as(
            token, "/ack", {"queueId": start["queueId"], "claimToken": start["claimToken"]}
        ).status_code
        == 200
    )
    follow_up = api.webhook(agent_session_event(session_id="as-revoked", action="prompted", body="and then?"))
    assert follow_up.json()["status"] == "dispatched", follow_up.text
    with connect(db_url, autocommit=False) as revoker:
        revoker.execute(query("orchestrator_revoke"), {"id": machine})  # the revoke, open
        stop = agent_session_event(session_id="as-revoked", action="prompted", signal="stop")
        t, out = in_thread(lambda: api.webhook(stop))
        _blocked_by(api.pool, revoker.info.backend_pid)  # the stop waits for the machine's row
        revoker.execute(query("revoke_move_starts"), {"id": machine})
        rest = revoker.execute(query("revoke_cancel_rest"), {"id": machine, "reason": "revoked"}).fetchone()
        revoker.commit()
    t.join(timeout=10)
    assert rest is not None and rest["cancelled"] == 1  # the follow-up
    assert out[0].status_code == 200, out[0].text
    assert out[0].json() == {"status": "stopped", "cancelledSessionIds": [], "stopSessionId": None}
    assert queue_of(api.pool) == []


def test_a_batch_of_stops_racing_a_revoke_never_deadlocks(api: Api, db_url: str) -> None:
    """Stops that arrive together are one transaction, each stop's statements in the order of their
    agent sessions. Here the first stop cancels a start still queued for the machine, and the
    second queues a `stop` for that machine (it has the conversation). A revoke holds the machine's
    row, then cancels the machine's messages. Were the first stop to cancel its start, a row of the
    machine, and the second then wait for the machine, each would wait for the other. Each stop
    takes the machines of its conversation before any of its rows (`cancel_agent_session`): the
    batch waits for the revoke holding none, the revoke cancels the start and commits, and the
    batch then finds the start gone and the machine revoked (no `stop` to queue)."""
    machine, token = api.register()
    api.webhook(agent_session_event(session_id="as-2-held"))
    [start] = api.post_as(token, "/claim", {"max": 10}).json()["messages"]
    ack = {"queueId": start["queueId"], "claimToken": start["claimToken"]}
    assert api.post_as(token, "/ack", ack).status_code == 200
    api.webhook(agent_session_event(session_id="as-1-queued"))  # queued for the machine, not claimed
    stops = [
        stop_of(agent_session_event(session_id=s, action="prompted", signal="stop"), f"d-stop-{s}")
        for s in ("as-2-held", "as-1-queued")
    ]

    def written() -> Any:
        try:
            return intake._stop_agent_sessions(api.pool, stops)
        except Exception as error:  # (what the batch raised, to look at here)
            return error

    with connect(db_url, autocommit=False) as revoker:
        revoker.execute(query("orchestrator_revoke"), {"id": machine})  # the revoke, open
        t, out = in_thread(written)
        _blocked_by(api.pool, revoker.info.backend_pid)  # the batch waits for the revoke
        revoker.execute(query("revoke_move_starts"), {"id": machine})
        rest = revoker.execute(query("revoke_cancel_rest"), {"id": machine, "reason": "revoked"}).fetchone()
        revoker.commit()
    t.join(timeout=10)
    assert rest is not None and rest["cancelled"] == 1  # the queued start, by the revoke
    assert isinstance(out[0], list), out[0]
    nothing_left: dict[str, Any] = {"status": "stopped", "cancelledSessionIds": [], "stopSessionId": None}
    assert [r.answer if r is not None else None for r in out[0]] == [nothing_left] * 2
    assert queue_of(api.pool) == []


@pytest.mark.parametrize("racer", ["revoke", "ack"])
def test_a_batch_ack_racing_a_revoke_or_another_ack_never_deadlocks(
    racer: str, api: Api, db_url: str
) -> None:
    """A batch ack names its rows in any order; a revoke takes its machine's rows in queue order
    (seq), and so may another ack of the same rows (a retried batch, say). Were the ack to take
    its rows in the order of its items, it could hold a later row while it waited for an earlier
    one that the other holds, and the other then wait for the later one: Postgres would abort one
    (503). The ack takes its rows in queue order too, so it waits holding nothing the other needs.
    Here the later row lies first in the table (an update moved the earlier row's newest version
    behind it), and the other's hold on the earlier row is a lock its transaction takes before its
    statement."""
    machine, token = api.register()
    for n in (1, 2):
        api.webhook(issue_event(issue_id=f"iss-batch-{n}"))
    messages = api.post_as(token, "/claim", {"max": 10}).json()["messages"]
    with api.pool.connection() as conn:
        in_queue_order = [r["id"] for r in conn.execute("SELECT id::text FROM dispatch_queue ORDER BY seq")]
    first, second = sorted(messages, key=lambda m: in_queue_order.index(m["queueId"]))
    with api.pool.connection() as conn:  # the first row's newest version now lies behind the second's
        conn.execute("UPDATE dispatch_queue SET attempts = attempts WHERE id = %s", (first["queueId"],))
        in_table_order = [r["id"] for r in conn.execute("SELECT id::text FROM dispatch_queue ORDER BY ctid")]
    assert in_table_order == [second["queueId"], first["queueId"]]
    backwards = {"acks": [{"queueId": m["queueId"], "claimToken": m["claimToken"]} for m in (second, first)]}
    with connect(db_url, autocommit=False) as other:
        if racer == "revoke":
            other.execute(query("orchestrator_revoke"), {"id": machine})
        other.execute("SELECT 1 FROM dispatch_queue WHERE id = %s FOR UPDATE", (first["queueId"],))
        t, out = in_thread(lambda: api.post_as(token, "/ack", backwards))
        _blocked_by(api.pool, other.info.backend_pid)  # the batch ack waits for the first row
        if racer == "revoke":
            other.execute(query("revoke_move_starts"), {"id": machine})
            other.execute(query("revoke_cancel_rest"), {"id": machine, "reason": "revoked"})
        else:
            in_order = [first, second]
            other.execute(
                query("ack"),
                {
                    "orchestrator_id": machine,
                    "queue_ids": [m["queueId"] for m in in_order],
                    "claim_tokens": [m["claimToken"] for m in in_order],
                    "public_url": None,
                },
            )
        other.commit()
    t.join(timeout=10)
    assert out[0].status_code == 200, out[0].text
    # After a revoke both were cancelled; after the other ack both are delivered, and a repeated
    # ack of a delivered row answers acked.
    expected = "not_found" if racer == "revoke" else "acked"
    results = out[0].json()["results"]
    assert [r["queueId"] for r in results] == [second["queueId"], first["queueId"]]
    assert all(r.get("error", r.get("status")) == expected for r in results), results
    assert queue_of(api.pool) == []
