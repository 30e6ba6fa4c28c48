"""Crashes and races of the core, with real processes and a real Postgres."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from shared.delivery.models import DispatchPayload
from shared.delivery.queue import AckItem, _ack_params, _session_params, ack, claim, enqueue_dispatch, sweep
from shared.plumbing.db import Pool, Tx, open_pool, transaction
from shared.plumbing.migrate import migrate
from shared.plumbing.settings import Settings
from shared.wire.messages import IssueRef
from tests.helpers.data import MakeOrch, Orch, bulk, enqueue_one, fill_queue, issue, row_counts
from tests.helpers.pg import Server
from tests.helpers.plans import explain, nodes

ROOT = Path(__file__).parent.parent
T0 = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


def bulk_enqueue(pool: Pool, orch: Orch, n: int) -> list[UUID]:
    ids = []
    with transaction(pool) as tx:
        for i in range(n):
            iss = issue(i, orch.org_id)
            ids.append(
                enqueue_dispatch(
                    tx,
                    org_id=orch.org_id,
                    orchestrator_id=orch.id,
                    linear_user_id=None,
                    message=DispatchPayload(issue=iss),
                ).queue_id
            )
    return ids


def table_counts(pool: Pool) -> tuple[int, int]:
    c = row_counts(pool)
    return c["sessions"], c["queue"]


@pytest.mark.parametrize("point", ["before-commit", "after-commit"])
def test_sigkill_around_commit_leaves_both_rows_or_neither(
    point: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    o = make_orchestrator()
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.enqueue_child", db_url, o.org_id, str(o.id), point],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.startswith("READY"), line
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    # The server notices the dead client and aborts its open transaction; wait for that.
    with pool.connection() as conn:
        for _ in range(100):
            busy = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%%'"
            ).fetchone()
            if busy is not None and busy["n"] == 0:
                break
            conn.execute("SELECT pg_sleep(0.05)")
    expected = (0, 0) if point == "before-commit" else (1, 1)
    assert table_counts(pool) == expected
    if point == "after-commit":
        [m] = claim(pool, o.id, max=5, lease_seconds=60)
        assert str(m.session_id) == line.split()[1]


def test_eight_processes_claim_every_row_exactly_once(
    pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    o = make_orchestrator()
    ids = bulk_enqueue(pool, o, 3000)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.claimer", db_url, str(o.id), str(seed)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for seed in range(8)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "GO"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("\n")
        p.stdin.flush()
    claimed: list[str] = []
    per_proc = []
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0
        got = json.loads(out.strip().splitlines()[-1])
        per_proc.append(len(got))
        claimed.extend(q for q, _ in got)
    assert len(claimed) == len(ids), "a row was claimed twice or not at all"
    assert sorted(claimed) == sorted(str(i) for i in ids)
    assert sum(1 for n in per_proc if n > 0) >= 2, f"no real contention: {per_proc}"
    with pool.connection() as conn:
        row = conn.execute("SELECT min(attempts) AS lo, max(attempts) AS hi FROM dispatch_queue").fetchone()
    assert row is not None and (row["lo"], row["hi"]) == (1, 1)


def test_concurrent_sweeps_never_double_count(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    n = 2500
    bulk_enqueue(pool, o, n)
    claim(pool, o.id, max=1000, lease_seconds=60, now=T0)
    claim(pool, o.id, max=1000, lease_seconds=60, now=T0)
    claim(pool, o.id, max=1000, lease_seconds=60, now=T0)
    settings = Settings()
    results = []
    barrier = threading.Barrier(4)

    def run() -> None:
        barrier.wait()
        results.append(sweep(pool, settings, now=T0 + timedelta(seconds=61)))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.requeued for r in results) == n
    assert sum(r.dead_lettered for r in results) == 0
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE lease_expires_at IS NULL) AS free, min(attempts) AS lo, "
            "max(attempts) AS hi, count(DISTINCT available_at) AS due FROM dispatch_queue"
        ).fetchone()
    assert row is not None
    assert (row["free"], row["lo"], row["hi"], row["due"]) == (n, 1, 1, 1)


def test_sweep_racing_ack_yields_exactly_one_outcome(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """At the attempt limit the sweep dead-letters and the ack delivers: each row gets one of them."""
    o = make_orchestrator()
    n = 600
    bulk_enqueue(pool, o, n)
    settings = Settings(DEVPILOT_MAX_ATTEMPTS=1)
    messages = claim(pool, o.id, max=1000, lease_seconds=60, now=T0)
    assert len(messages) == n
    outcomes: dict[UUID, str] = {}
    sweeps = []
    barrier = threading.Barrier(3)

    def acker(part: list[int]) -> None:
        barrier.wait()
        for i in part:
            m = messages[i]
            outcomes[m.session_id] = ack(pool, o.id, m.queue_id, m.claim_token)

    def sweeper() -> None:
        barrier.wait()
        for _ in range(20):
            sweeps.append(sweep(pool, settings, now=T0 + timedelta(seconds=61)))

    threads = [
        threading.Thread(target=acker, args=(list(range(0, n, 2)),)),
        threading.Thread(target=acker, args=(list(range(1, n, 2)),)),
        threading.Thread(target=sweeper),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with pool.connection() as conn:
        statuses = {r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM dispatch_sessions")}
    dead = sum(s.dead_lettered for s in sweeps)
    acked = sum(1 for v in outcomes.values() if v == "acked")
    assert acked + dead == n
    assert table_counts(pool) == (n, 0)
    for sid, outcome in outcomes.items():
        assert outcome in ("acked", "not_found")
        assert statuses[sid] == ("delivered" if outcome == "acked" else "failed")


def test_migrations_are_safe_when_several_run_at_once(pg_server: Server) -> None:
    name = "devpilot_mig_" + os.urandom(4).hex()
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = pg_server.url_for(name)
    try:
        applied: list[list[str]] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(4)

        def run() -> None:
            barrier.wait()
            try:
                applied.append(migrate(url))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sorted(len(a) for a in applied)[-1] >= 1
        assert sum(len(a) for a in applied) == len(max(applied, key=len))  # each file applied once
        assert migrate(url) == []
    finally:
        pg_server.drop(name)


@pytest.mark.parametrize("statement", ["claim", "poll"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_claim_plan_probes_the_claim_index(
    mode: str, statement: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """With many rows of other orchestrators, both the generic plan (what a prepared claim gets after
    five runs) and the custom plan must read the partial claim index, not the table — the library's
    claim by machine id and the poll route's one statement (who is calling + claim) alike."""
    from shared.fleet.orchestrators import hash_token

    o, busy = make_orchestrator(), make_orchestrator()
    fill_queue(pool, busy, 50_000)
    with pool.connection() as conn:
        conn.execute("ANALYZE dispatch_queue")
    from shared.plumbing.sql import query_with_limit

    q = query_with_limit(statement, 10)  # (as the library sends it: the LIMIT written in)
    params = {"orchestrator_id": o.id, "token_hash": hash_token(o.token), "max": 10, "lease_seconds": 60}
    with open_pool(db_url, Settings(), min_size=1, max_size=1) as p, p.connection() as conn:
        with conn.transaction():
            plan = explain(conn, q, {**params, "now": None}, mode=mode)
    text = json.dumps(plan)
    assert "dispatch_queue_claim_idx" in text, text
    assert "Seq Scan" not in text, text
    top = plan["QUERY PLAN"][0]
    assert top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0) < 50, text


@pytest.mark.parametrize("statement", ["claim", "poll"])
def test_a_claim_is_planned_once_per_connection_not_at_every_execution(
    statement: str, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """Postgres keeps a prepared statement's generic plan once it costs about what a fresh plan
    does; otherwise it plans the statement again at every execution. With the claim's LIMIT a bound
    parameter, the generic plan assumed a tenth of the due rows (a hash join over the whole queue
    of a machine with a backlog) and was never kept. With the LIMIT written in, after psycopg
    prepares it and Postgres's five trial plans, each claim of a machine that drains a backlog runs
    the kept plan, and that plan probes the claim index and the queue's key, never the table."""
    from shared.delivery.queue import poll
    from shared.fleet.orchestrators import hash_token
    from shared.plumbing.sql import query_with_limit

    o = make_orchestrator()
    with open_pool(db_url, Settings(), min_size=1, max_size=1) as p:
        fill_queue(p, o, 5_000)  # (its own backlog: the rows the claim takes)
        with p.connection() as conn:
            conn.execute("ANALYZE dispatch_queue")
        for _ in range(20):  # (psycopg prepares it at the 6th)
            if statement == "claim":
                assert len(claim(p, o.id, max=10, lease_seconds=60)) == 10
            else:
                found = poll(p, hash_token(o.token), max=10, lease_seconds=60)
                assert found is not None and len(found[1]) == 10
        with p.connection() as conn:
            text = query_with_limit(statement, 10)
            kept = conn.execute(  # (as psycopg prepared it: its placeholders numbered)
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE '%%claim_token = gen_random_uuid()%%'"
            ).fetchone()
            # Five trial plans, then the kept one for every run after (it was custom at every run).
            assert kept is not None and kept["custom_plans"] <= 5 and kept["generic_plans"] >= 10, kept
            params = {
                "orchestrator_id": o.id,
                "token_hash": hash_token(o.token),
                "max": 10,
                "lease_seconds": 60,
                "now": None,
            }
            with conn.transaction(force_rollback=True):
                plan = explain(conn, text, params, mode="force_generic_plan", options="COSTS")
            # A batch of 3 reads candidates up to its ceiling, 4, and locks no more than 3 of them.
            with conn.transaction(force_rollback=True):
                three = explain(
                    conn, query_with_limit(statement, 3), {**params, "max": 3}, mode="force_generic_plan"
                )
    assert "Seq Scan" not in json.dumps(plan), plan
    assert ("Index Scan", "dispatch_queue", "dispatch_queue_pkey") in _relations(
        plan["QUERY PLAN"][0]["Plan"]
    )
    # (The poll's statement has a second LockRows: its caller's row, when it marks it seen.)
    locked = [n["Actual Rows"] for n in nodes(three["QUERY PLAN"][0]["Plan"]) if n["Node Type"] == "LockRows"]
    assert max(locked) == 3, locked


def _relations(node: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """Each plan node that reads or writes a table, under `node` (an EXPLAIN FORMAT JSON plan):
    (node type, table, index), sorted."""

    return sorted(
        (n["Node Type"], n["Relation Name"], n.get("Index Name"))
        for n in nodes(node)
        if n.get("Relation Name")
    )


def _steady_write_plan(
    db_url: str, mode: str, sql: str, params: Callable[[Tx, int], dict[str, Any]]
) -> dict[str, Any]:
    """The plan of a write (`sql`, EXPLAIN ANALYZE, prepared) under `mode`, at its second run in
    one transaction that is rolled back: the first run warms the caches, the second is the steady
    state. `params(tx, n)` gives each run's values (and may write what the run needs first)."""
    plan: dict[str, Any] | None = None
    with open_pool(db_url, Settings(), min_size=1, max_size=1) as p, p.connection() as conn:
        with pytest.raises(RuntimeError), transaction(conn) as tx:
            for n in range(2):
                plan = explain(tx.conn, sql, params(tx, n), mode=mode)
            raise RuntimeError("roll back")
    assert plan is not None
    return plan


def _start_rows() -> dict[str, Any]:
    """A start's session and queue-row values (issue `i`, a new session id), as the library's
    enqueue gives them to the statement (`enqueue_session_rows`)."""
    return _session_params(DispatchPayload(issue=IssueRef(id="i", identifier="X-1")), None, None)


@pytest.mark.parametrize("statement", ["enqueue", "enqueue_for_delivery"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_enqueue_reads_no_table_in_either_plan(
    mode: str, statement: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """The enqueue writes the session and its queue row without scanning anything but its machine's
    row (by primary key: is it active, is a long-poll waiting?) and its webhook delivery's (by
    primary key, to record the outcome), in both plans, even when the org has many queued
    sessions (an earlier enqueue read the session back, and a generic plan once read all of the
    org's queued sessions on every webhook)."""
    from shared.plumbing.sql import query

    o = make_orchestrator()
    fill_queue(pool, o, 20_000)  # and not analysed yet, as after a burst of webhooks

    def params(tx: Tx, n: int) -> dict[str, Any]:
        key = f"delivery-{n}"  # recorded first, as the intake does
        tx.execute(
            query("record_delivery"),
            {
                "key": key,
                "content_key": key,
                "org_id": o.org_id,
                "route_user": None,
                "agent_session_id": None,
                "issue_id": None,
                "event_at": None,
                "created": False,
                "prompt_at": None,
            },
        )
        return {
            **_start_rows(),
            "orchestrator_id": o.id,
            "org_id": o.org_id,
            "linear_user_id": None,
            "delivery_key": key,
        }

    plan = _steady_write_plan(db_url, mode, query(statement), params)
    text = json.dumps(plan)

    top = plan["QUERY PLAN"][0]["Plan"]
    touched = _relations(top)
    delivery = [  # (the intake's: the delivery's row by its key, its outcome written)
        ("Index Scan", "webhook_deliveries", "webhook_deliveries_pkey"),
        ("ModifyTable", "webhook_deliveries", None),
    ]
    assert touched == sorted(  # two inserts, the machine's row by its key, no scan
        [
            ("Index Scan", "orchestrators", "orchestrators_pkey"),
            ("ModifyTable", "dispatch_queue", None),
            ("ModifyTable", "dispatch_sessions", None),
            *(delivery if statement == "enqueue_for_delivery" else []),
        ]
    ), text
    assert top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0) < 60, text


# What a start's one statement reads and writes: the routing read, the machine's row by its key,
# the delivery, the session and its queue row.
START_PLAN = [
    ("Index Scan", "orchestrators", "orchestrators_route_idx"),
    ("Index Scan", "orchestrators", "orchestrators_pkey"),
    ("ModifyTable", "webhook_deliveries", None),
    ("ModifyTable", "dispatch_sessions", None),
    ("ModifyTable", "dispatch_queue", None),
]
# A start's routing request, for a user whose machines differ.
ROUTING_PLAN = [("ModifyTable", "routing_requests", None)]
# An issue's assignment (`issue_changes_for_delivery`): the machines it locks, chosen and of the
# rows it cancels, and the sessions it cancels, by their keys at once (bitmaps of the primary
# keys); the issue's undelivered start found by its session, locked and deleted by its key.
ISSUE_CHANGE_PLAN = [
    ("Index Scan", "orchestrators", "orchestrators_route_idx"),
    ("Bitmap Heap Scan", "orchestrators", None),
    ("Index Scan", "dispatch_queue", "dispatch_queue_session_id_key"),
    ("Index Scan", "dispatch_queue", "dispatch_queue_pkey"),
    ("Index Scan", "dispatch_queue", "dispatch_queue_pkey"),
    ("Bitmap Heap Scan", "dispatch_sessions", None),
    ("ModifyTable", "webhook_deliveries", None),
    ("ModifyTable", "dispatch_queue", None),
    ("ModifyTable", "dispatch_sessions", None),
    ("ModifyTable", "dispatch_sessions", None),
    ("ModifyTable", "dispatch_queue", None),
]
# Linear's notices: whether the org is told, an index probe within the statement
# (`devpilot_notified`, inlined), then the rows written.
NOTICES_PLAN = [
    ("Index Only Scan", "linear_credentials", "linear_credentials_pkey"),
    ("ModifyTable", "linear_notices", None),
]


def _a_busy_org(pool: Pool, make_orchestrator: MakeOrch) -> Orch:
    """A machine with 20,000 queued rows, in an org with 5,000 other people's machines."""
    o = make_orchestrator()
    fill_queue(pool, o, 20_000)
    bulk(
        pool,
        "INSERT INTO orchestrators (org_id, linear_user_id, name, token_hash)"
        " SELECT %(org)s, 'someone-' || i, 'm', sha256(i::text::bytea) FROM generate_series(1, 5000) i",
        {"org": o.org_id},
    )
    with pool.connection() as conn:
        conn.execute("ANALYZE orchestrators")
    return o


@pytest.mark.parametrize("agent_sessions", [False, True], ids=["issues", "agent-sessions"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_starts_written_together_read_no_table_in_either_plan(
    mode: str, agent_sessions: bool, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """A group commit's one statement for starts — of issues (`issue_changes_for_delivery`, each
    issue's undelivered start, from the run before, found by its session and cancelled) or of agent
    sessions `created` (`route_and_start_agent_sessions_many_for_delivery`, with Linear's notices) —
    finds each one's machine by the routing index and locks it by its key, and writes the
    deliveries, sessions and queue rows, in both plans, with thousands of machines in the org and
    many queued sessions."""
    from psycopg.types.json import Jsonb

    from shared.plumbing.sql import query

    o = _a_busy_org(pool, make_orchestrator)
    users = [o.linear_user_id] * 6 + ["someone-7", "nobody"]  # (someone-7 has a machine too)

    def params(_tx: Tx, n: int) -> dict[str, Any]:
        batch = [
            {
                "n": i,
                "org_id": o.org_id,
                "route_user": user,
                "delivery_key": f"delivery-{n}-{i}",
                "content_key": f"content-{n}-{i}",
                "session_id": str(uuid.uuid4()),
                "issue_id": f"i-{i}",
                "issue_identifier": f"X-{i}",
                "agent_session_id": f"as-{n}-{i}" if agent_sessions else None,
                "reason": "re-assigned",
                "payload": {
                    "issue": {"id": f"i-{i}"},
                    "agentSessionId": f"as-{n}-{i}" if agent_sessions else None,
                },
            }
            for i, user in enumerate(users)
        ]
        return {"batch": Jsonb(batch), "now": None, "unroutable": "no machine"}

    statement = (
        "route_and_start_agent_sessions_many_for_delivery" if agent_sessions else "issue_changes_for_delivery"
    )
    plan = _steady_write_plan(db_url, mode, query(statement), params)
    text = json.dumps(plan)
    top = plan["QUERY PLAN"][0]["Plan"]
    expected = [*START_PLAN, *NOTICES_PLAN] if agent_sessions else ISSUE_CHANGE_PLAN
    assert _relations(top) == sorted([*expected, *ROUTING_PLAN]), text
    for key in ("orchestrators_pkey", *([] if agent_sessions else ["dispatch_sessions_pkey"])):
        assert f'"Index Name": "{key}"' in text, text
    assert top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0) < 80 * len(users), text


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_an_issues_turn_probes_its_open_dispatch_by_the_index(
    mode: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """The group commit asks, per issue, what of it is still undelivered
    (`devpilot_issue_undelivered`, migration 0025): the query inside the function, read from the
    database itself, finds it by the partial index of open issues, in both plans, beside 20,000
    queued sessions of the same org (one of them this issue's)."""
    import re

    from psycopg import sql

    o = make_orchestrator()
    fill_queue(pool, o, 20_000)  # issues bulk-1 .. bulk-20000, all queued
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT prosrc FROM pg_proc WHERE proname = 'devpilot_issue_undelivered'"
        ).fetchone()
        assert row is not None
        probe = re.search(r"ARRAY\((.*?)\);", row["prosrc"], re.S)
        assert probe is not None, row["prosrc"]
        conn.execute(f"SET plan_cache_mode = {mode}")
        conn.execute(f"PREPARE probe(text, text) AS {probe.group(1)}")
        for issue, found in (("bulk-77", 1), ("elsewhere", 0)):
            run = sql.SQL("EXECUTE probe({}, {})").format(sql.Literal(o.org_id), sql.Literal(issue))
            for _ in range(6):  # (a generic plan is chosen after five custom ones, if at all)
                conn.execute(run)
            explained = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + run).fetchone()
            assert explained is not None
            plan = explained["QUERY PLAN"]
            top = plan[0]["Plan"]
            assert _relations(top) == [
                ("Index Scan", "dispatch_sessions", "dispatch_sessions_open_issue_idx")
            ], plan
            # by the issue itself, not the org's queued sessions filtered one by one
            assert "issue_id" in top["Index Cond"] and top.get("Rows Removed by Filter", 0) == 0, plan
            assert top["Actual Rows"] == found, plan
        conn.execute("DEALLOCATE probe")


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_a_follow_up_reads_no_table_in_either_plan(
    mode: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """The follow-ups' statement (`follow_ups_for_delivery`) reaches each machine's row by its key
    (the holder's, or the one routing chooses for an agent session nobody holds) and writes the
    deliveries, the sessions, their queue rows and Linear's notices, in both plans, beside 20,000
    queued sessions of the same org (the holder, the stop and the routing request are read by
    functions, below)."""
    from psycopg.types.json import Jsonb

    from shared.plumbing.sql import query

    o = _a_busy_org(pool, make_orchestrator)

    def params(tx: Tx, n: int) -> dict[str, Any]:
        batch = []
        for i in range(4):
            held = f"agent-session-{n}-{i}"
            start = DispatchPayload(
                issue=IssueRef(id="i", identifier="X-1"), agent_session_id=held, kind="start"
            )
            if i % 2 == 0:  # (held; the others nobody holds: started on the writer's machine)
                enqueue_dispatch(
                    tx, org_id=o.org_id, orchestrator_id=o.id, linear_user_id=o.linear_user_id, message=start
                )
            batch.append(
                {
                    "n": i,
                    "org_id": o.org_id,
                    "route_user": o.linear_user_id,
                    "delivery_key": f"delivery-{n}-{i}",
                    "content_key": f"content-{n}-{i}",
                    "session_id": str(uuid.uuid4()),
                    "issue_id": "i",
                    "issue_identifier": "X-1",
                    "agent_session_id": held,
                    "payload": replace(start, kind="prompt").wire(),
                    "start": start.wire(),
                    "prompt_at": None,
                    "picked": None,
                }
            )
        return {"batch": Jsonb(batch), "now": None, "unroutable": "none"}

    plan = _steady_write_plan(db_url, mode, query("follow_ups_for_delivery"), params)
    text = json.dumps(plan)
    top = plan["QUERY PLAN"][0]["Plan"]
    reads = [r for r in _relations(top) if r[0] != "ModifyTable"]
    assert all(r[2] is not None for r in reads), reads  # (each by an index)
    assert {r[1] for r in reads} == {"orchestrators", "linear_credentials", "routing_requests"}, reads
    writes = {r[1] for r in _relations(top) if r[0] == "ModifyTable"}
    assert writes == {
        "webhook_deliveries",
        "dispatch_sessions",
        "dispatch_queue",
        "routing_requests",
        "linear_notices",
    }, text
    assert top["Actual Rows"] == 4, text
    with open_pool(db_url, Settings(), min_size=1, max_size=1) as p, p.connection() as conn:
        assert conn.execute(
            "SELECT count(*) AS n FROM dispatch_sessions WHERE kind = 'prompt'"
        ).fetchone() == {"n": 0}  # (rolled back)
    assert top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0) < 80 * 4, text


def _function_query_plans(
    conn: Any, mode: str, function: str, query_pattern: str, params: list[str], runs: list[tuple[Any, ...]]
) -> list[Any]:
    """The plans, in `mode`, of one query inside a PL/pgSQL function (`query_pattern`: a regular
    expression whose group 1 is the query, read from the database's own copy of the function),
    prepared with the function's `params` as $1, $2, ... and run with each of `runs`."""
    import re

    from psycopg import sql

    row = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (function,)).fetchone()
    assert row is not None
    found = re.search(query_pattern, row["prosrc"], re.S)
    assert found is not None, row["prosrc"]
    body = found.group(1)
    for i, name in enumerate(params, 1):
        body = re.sub(rf"\b{name}\b", f"${i}", body)
    conn.execute(f"SET plan_cache_mode = {mode}")
    types = conn.execute(
        "SELECT array_to_string(proargtypes::regtype[], ', ') AS t FROM pg_proc WHERE proname = %s",
        (function,),
    ).fetchone()["t"]
    conn.execute(f"PREPARE inside({types}) AS {body}")
    plans = []
    for args in runs:
        run = sql.SQL("EXECUTE inside({})").format(sql.SQL(", ").join(map(sql.Literal, args)))
        for _ in range(6):  # (a generic plan is chosen after five custom ones, if at all)
            conn.execute(run)
        explained = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + run).fetchone()
        assert explained is not None
        plans.append(explained["QUERY PLAN"])
    conn.execute("DEALLOCATE inside")
    return plans


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_an_agent_sessions_holder_is_read_by_its_index(
    mode: str, pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """Who holds an agent session (`devpilot_agent_session_holder`, migration 0013: a follow-up's
    statement's and routing's), whether it was ever started (`devpilot_agent_session_seen`,
    migration 0014: a `created`'s) and its open routing request (`devpilot_agent_session_request`,
    migration 0024: a follow-up's): the queries inside the functions, read from the database
    itself, find the agent session by its index, in both plans, beside 20,000 queued sessions and
    5,000 open routing requests of the same org."""
    o = make_orchestrator()
    fill_queue(pool, o, 20_000)
    held = DispatchPayload(issue=IssueRef(id="i", identifier="X-1"), agent_session_id="as-held", kind="start")
    with transaction(pool) as tx:
        enqueue_dispatch(
            tx, org_id=o.org_id, orchestrator_id=o.id, linear_user_id=o.linear_user_id, message=held
        )
    bulk(
        pool,
        "INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message)"
        " SELECT %(org)s, CASE WHEN i = 1 THEN 'as-held' ELSE 'as-' || i END, 'i', 'assignee', '{}'"
        " FROM generate_series(1, 5000) i",
        {"org": o.org_id},
    )
    inside = {  # each function: its query, its parameters' names, and the index it must read
        "devpilot_agent_session_holder": (
            r"RETURN QUERY(.*?);",
            ["org", "agent_session", "delivered_only"],
            ("dispatch_sessions", {"dispatch_sessions_agent_idx"}),
        ),
        "devpilot_agent_session_seen": (
            r"IF EXISTS \((SELECT FROM dispatch_sessions .*?)\) THEN",
            ["org", "agent_session", "wait"],
            ("dispatch_sessions", {"dispatch_sessions_agent_idx"}),
        ),
        "devpilot_agent_session_request": (
            r"RETURN QUERY(.*?);",
            ["org", "agent_session"],
            # (the open requests' index, or every request's of an agent session: both by its key)
            ("routing_requests", {"routing_requests_agent_idx", "routing_requests_conversation_idx"}),
        ),
    }
    with pool.connection() as conn:
        conn.execute("ANALYZE dispatch_sessions")
        conn.execute("ANALYZE routing_requests")
        for function, (q, names, (table, indexes)) in inside.items():
            runs = [
                (o.org_id, "as-held", False)[: len(names)],
                (o.org_id, "as-elsewhere", False)[: len(names)],
            ]
            found = _function_query_plans(conn, mode, function, q, names, runs)
            for plan, n in zip(found, [1, 0], strict=True):
                scans = [r for r in _relations(plan[0]["Plan"]) if r[1] == table]
                assert scans and all(r[2] in indexes for r in scans), (function, plan)
                assert plan[0]["Plan"]["Actual Rows"] == n, (function, plan)


# Each time check a webhook's statement makes through a function: the function, the rows beside
# which it runs, its parameters' names, two calls, the rows each finds, and the index it must probe.
TIME_PROBES = {
    # An assignment older than a later change of its issue (migration 0015: every issue start's
    # test), beside 20,000 deliveries of other issues and 20,000 edits (which the index leaves out).
    "devpilot_issue_event_superseded": (
        "INSERT INTO webhook_deliveries (delivery_key, content_key, org_id, issue_id, event_at)"
        " SELECT 'd-' || i, 'c-' || i, 'org-a', 'issue-' || (i % 5000),"
        "        CASE WHEN i <= 20000 THEN now() - make_interval(secs => i) END"
        " FROM generate_series(1, 40000) i",
        ["org", "issue", "at"],
        "issue-7",
        [4, 0],  # (issue-7's four changes: all later, or none)
        ("webhook_deliveries", "webhook_deliveries_issue_event_idx"),
    ),
    # A follow-up written before a stop of its agent session (migration 0016: every follow-up's
    # test), beside 20,000 stops of other agent sessions.
    "devpilot_agent_session_stopped_since": (
        "INSERT INTO agent_session_stops (org_id, agent_session_id, last_stop_at)"
        " SELECT 'org-a', 'as-' || i, now() - make_interval(secs => i) FROM generate_series(1, 20000) i",
        ["org", "agent_session", "written"],
        "as-7",
        [1, 0],  # (stopped after the first time, not the second)
        ("agent_session_stops", "agent_session_stops_pkey"),
    ),
}


@pytest.mark.parametrize("function", sorted(TIME_PROBES))
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_a_webhooks_time_check_probes_its_index(mode: str, function: str, pool: Pool) -> None:
    """Whether a later change of the issue was handled, or the agent session was stopped after the
    follow-up was written: read from the database's own copy of each function, its query probes its
    index, in both plans, beside many rows of other issues or agent sessions."""
    fill, names, key, found, (table, index) = TIME_PROBES[function]
    with pool.connection() as conn:
        conn.execute(fill)
        conn.execute(f"ANALYZE {table}")
        plans = _function_query_plans(
            conn,
            mode,
            function,
            r"EXISTS \((.*?)\);",
            names,
            [
                ("org-a", key, datetime(2000, 1, 1, tzinfo=UTC)),
                ("org-a", key, datetime(2999, 1, 1, tzinfo=UTC)),
            ],
        )
    for plan, n in zip(plans, found, strict=True):
        scans = [r for r in _relations(plan[0]["Plan"]) if r[1] == table]
        assert scans and all(r[2] == index for r in scans), plan
        assert plan[0]["Plan"]["Actual Rows"] == n, plan


@pytest.mark.parametrize("statement", ["ack", "ack_as"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_ack_plan_probes_by_key(
    mode: str, statement: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """An ack reads its rows by key, never the table, in both plans: the library's ack by machine id
    and the ack route's one statement (who is calling + the acks) alike, beside 50,000 rows of
    another machine. (It acks a row it claimed, so the delete and the session update run too.)"""
    from shared.fleet.orchestrators import hash_token
    from shared.plumbing.sql import query

    o, busy = make_orchestrator(), make_orchestrator()
    fill_queue(pool, busy, 50_000)
    enqueue_one(pool, o)
    [m] = claim(pool, o.id, max=1, lease_seconds=60)
    with pool.connection() as conn:
        conn.execute("ANALYZE dispatch_queue")
        conn.execute("ANALYZE dispatch_sessions")
    params = {
        "orchestrator_id": o.id,
        "token_hash": hash_token(o.token),
        **_ack_params([AckItem(m.queue_id, m.claim_token)], None),  # (as the ack sends them)
    }
    with open_pool(db_url, Settings(), min_size=1, max_size=1) as p, p.connection() as conn:
        with conn.transaction():
            plan = explain(conn, query(statement), params, mode=mode)
    text = json.dumps(plan)
    assert "Seq Scan" not in text, text
    assert text.count("dispatch_queue_pkey") >= 1, text
    # Whether the delivered start's org is told: a probe of `linear_credentials` within the
    # statement (`devpilot_notified`, inlined), not a function run for each delivered row
    # (migration 0018; the old call shows in the plan as a filter naming it).
    assert "devpilot_notif" not in text, text
    top = plan["QUERY PLAN"][0]
    assert top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0) < 100, text


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_a_stop_reads_its_agent_sessions_rows_by_key(
    mode: str, pool: Pool, db_url: str, make_orchestrator: MakeOrch
) -> None:
    """A stop's cancel (`cancel_agent_session`, which locks the rows in the agent session's order)
    reads them from the agent-order index in both plans, never the table, beside 50,000 messages of
    other agent sessions of its org."""
    from psycopg.types.json import Jsonb

    from shared.plumbing.sql import query

    o = make_orchestrator()
    fill_queue(pool, o, 50_000)
    # the messages of 1,000 other agent sessions of the same org
    bulk(pool, "UPDATE dispatch_queue SET agent_session_id = 'as-other-' || (seq % 1000)")
    with pool.connection() as conn:
        conn.execute("ANALYZE dispatch_queue")
    params = {"batch": Jsonb([{"org_id": o.org_id, "agent_session_id": "as-1"}]), "reason": "stopped"}
    with open_pool(db_url, Settings(), min_size=1, max_size=1) as p, p.connection() as conn:
        with conn.transaction():
            plan = explain(conn, query("cancel_agent_session"), params, mode=mode)
    text = json.dumps(plan)
    assert "Seq Scan" not in text, text
    assert "dispatch_queue_agent_order_idx" in text, text
    top = plan["QUERY PLAN"][0]
    assert top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0) < 50, text


@pytest.mark.parametrize("form", ["any", "ids", "agent_sessions"])
@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_outbox_take_reads_only_connected_orgs_due_posts(mode: str, form: str, pool: Pool) -> None:
    """The outbox's takes read only due posts of connected orgs, by index, in both plans: the
    sweep's first round (`notice_take_due`, any due post: a probe per connected org, 300 here) and
    the send after a commit and every next round, the sweep's included (`notice_take`, the posts
    named by id or by agent session: those rows by key). A disconnected org's posts wait for a new
    install, and 50,000 of them (a fleet's activities while a workspace's token was refused) are not
    read: read at every take, they made the sweep's round slow, and past the statement's deadline
    its sending failed for every org. Nor is the history of sent posts read, nor posts given up. (Through the
    service's own pool, whose sessions run without JIT.)"""
    from shared.plumbing.sql import query

    bulk(
        pool,
        "INSERT INTO linear_credentials (org_id, token_encrypted, disconnected_at)"
        " SELECT org, 'x'::bytea, gone FROM (VALUES ('org-gone', now()), ('org-live', NULL)) AS k(org, gone)"
        " UNION ALL SELECT 'org-' || i, 'x', NULL FROM generate_series(1, 300) i",
    )
    bulk(
        pool,
        "INSERT INTO linear_notices (org_id, kind, agent_session_id, body, sent_at, available_at)"
        " SELECT org, 'activity', 'as-' || (i % 1000), 'b', sent, due"
        " FROM generate_series(1, 50000) i,"
        "      (VALUES ('org-gone', NULL::timestamptz, now() - interval '1 hour'),"
        "              ('org-live', now(), now() - interval '1 hour'),"
        "              ('org-live', NULL, 'infinity')) AS k(org, sent, due)"
        " WHERE k.due < 'infinity' OR i <= 5000",  # (5,000 given up)
    )
    with transaction(pool) as tx:
        row = tx.one(
            "INSERT INTO linear_notices (org_id, kind, agent_session_id, body)"
            " VALUES ('org-live', 'activity', 'as-live', 'due') RETURNING id"
        )
    assert row is not None
    due = row["id"]
    with pool.connection() as conn:
        conn.execute("ANALYZE linear_notices")
        conn.execute("ANALYZE linear_credentials")
    if form == "any":
        statement, params, pages = "notice_take_due", {}, 1000
    else:
        ids, sessions = ([due], None) if form == "ids" else (None, ["as-live"])
        statement, params, pages = "notice_take", {"ids": ids, "agent_sessions": sessions}, 100
    with pool.connection() as conn, conn.transaction(force_rollback=True):
        plan = explain(conn, query(statement), params, mode=mode)
    top = plan["QUERY PLAN"][0]
    text = json.dumps(plan)
    assert top["Plan"]["Actual Rows"] == 1, text  # the one due post of the connected org
    assert ("Seq Scan", "linear_notices", None) not in _relations(top["Plan"]), text
    assert top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0) < pages, text
    # Estimated far above `jit_above_cost` (its order check's guess at every row), and not compiled:
    # the service's sessions run without JIT (`shared.plumbing.db.session_options`), which here took 0.4 s.
    assert top["Plan"]["Total Cost"] > 100_000 or form != "any", text
    assert "JIT" not in top, text
