"""Library-level figures: the commit baseline, the core cycle, idle cost, scaling."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench import cpu
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import AckItem, ack_many, claim, enqueue_dispatch, sweep
from shared.fleet.orchestrators import register
from shared.plumbing.db import Pool, lend, open_pool, statement, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query, query_with_limit
from shared.wire.messages import IssueRef

SETTINGS = Settings(DEVPILOT_POOL_MAX=40)
# Filling a million rows is one long statement; the product's 2 s statement timeout is not for it.
# (Nor is the client's deadline for a block of work outside a request.)
FILL_SETTINGS = Settings(
    DEVPILOT_POOL_MAX=4, DEVPILOT_STATEMENT_TIMEOUT_MS=600_000, DEVPILOT_SWEEP_DEADLINE_SECONDS=3600
)


def run_threads(n: int, work: Callable[[int], int], seconds: float) -> float:
    """Run `work(i)` in n threads until `seconds` pass; returns units of work per second."""
    done, elapsed = count_threads(n, work, seconds)
    return done / elapsed


def count_threads(n: int, work: Callable[[int], int], seconds: float) -> tuple[int, float]:
    """`run_threads`, answering the units of work done and the seconds they took."""
    done = [0] * n
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            done[i] += work(i)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done), time.monotonic() - t0


def commit_baseline(url: str, concurrency: int, seconds: float) -> float:
    """Single-row INSERT transactions per second: the ceiling for anything that commits per message."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS bench_commit (id bigserial PRIMARY KEY, v text)")
    conns = [psycopg.connect(url, autocommit=True) for _ in range(concurrency)]

    def one(i: int) -> int:
        conns[i].execute("INSERT INTO bench_commit (v) VALUES ('x')")
        return 1

    rate = run_threads(concurrency, one, seconds)
    for c in conns:
        c.close()
    return rate


def enqueuer(pool: Pool, machine_user: str, *, one_statement: bool = False) -> Callable[[], None]:
    """A machine registered for the Linear user `machine_user`, and a function that enqueues one
    message for it in a transaction of its own: the library's enqueue as every figure here runs it,
    in a `transaction()` block (BEGIN, the statement, COMMIT), or with `one_statement` as a
    `statement()` transaction (the statement alone, as an issue's webhook is taken)."""
    orch = register(pool, org_id="bench", linear_user_id=machine_user, name="m")
    payload = DispatchPayload(issue=IssueRef(id="i", identifier="B-1", title="bench"))
    begin = statement if one_statement else transaction

    def enqueue() -> None:
        with begin(pool) as tx:
            enqueue_dispatch(tx, org_id="bench", orchestrator_id=orch.id, linear_user_id="u", message=payload)

    return enqueue


def enqueue_rate(url: str, concurrency: int, seconds: float, *, one_statement: bool = False) -> float:
    return enqueue_cpu_split(url, concurrency, seconds, one_statement=one_statement)["rate"] or 0.0


def enqueue_cpu_split(
    url: str, concurrency: int, seconds: float, *, one_statement: bool = False
) -> dict[str, float | None]:
    """Enqueues a second by `concurrency` clients (`rate`), and what each enqueue cost in CPU (ms):
    this process (the library and psycopg, the client side) and every Postgres process (the
    statement, its triggers, the commit), read before the pool's connections close. The two share
    the machine's cores, so this is where the rate's time went."""
    pool = open_pool(url, SETTINGS, min_size=concurrency, max_size=concurrency + 2)
    try:
        enqueue = enqueuer(pool, "u", one_statement=one_statement)

        def one(i: int) -> int:
            enqueue()
            return 1

        me0, pg0 = cpu.self_seconds(), cpu.postgres_by_process()
        done, elapsed = count_threads(concurrency, one, seconds)
        me1, pg1 = cpu.self_seconds(), cpu.postgres_by_process()
    finally:
        pool.close()
    return {
        "rate": round(done / elapsed),
        "client": cpu.per_unit_ms(me0, me1, done),
        "postgres": cpu.per_unit_ms(0.0, cpu.postgres_used(pg0, pg1), done),
    }


def invariant_trigger_ms(url: str, n: int) -> dict[str, float]:
    """Postgres's time inside the invariant trigger's function per enqueue (ms; it runs twice at
    each enqueue's commit, once for the session row and once for the queue row), from
    pg_stat_user_functions over n enqueues on one connection that tracks its functions. The
    function's own time: the trigger machinery around the call is not in it."""
    pool = open_pool(url, SETTINGS, max_size=1)
    try:
        enqueue = enqueuer(pool, "trigger")
        with lend(pool) as conn:  # (max_size 1: every transaction below runs on this connection)
            try:
                conn.execute("SET track_functions = 'pl'")
            except psycopg.errors.InsufficientPrivilege:  # (a superuser's setting)
                return {}

        def calls_and_ms() -> tuple[int, float]:
            return _invariant_trigger_totals(pool, url)

        for _ in range(100):  # (plans cached)
            enqueue()
        calls0, ms0 = calls_and_ms()
        for _ in range(n):
            enqueue()
        calls1, ms1 = calls_and_ms()
        return {
            "calls_per_enqueue": round((calls1 - calls0) / n, 2),
            "ms_per_enqueue": round((ms1 - ms0) / n, 4),
        }
    finally:
        pool.close()


def _invariant_trigger_totals(pool: Pool, url: str) -> tuple[int, float]:
    """The invariant trigger's calls and its function's own ms so far in `url`'s database, with
    `track_functions = 'pl'` set on `pool`'s one connection: the statistics are sent first."""
    with lend(pool) as conn:
        if conn.info.server_version >= 150000:  # (before 15, sent at each transaction's end)
            conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)  # (sent when the connection is next idle)
    with psycopg.connect(url, autocommit=True) as other:
        row = other.execute(
            "SELECT coalesce(sum(calls), 0), coalesce(sum(self_time), 0) FROM pg_stat_user_functions"
            " WHERE funcname = 'devpilot_check_session_invariant'"
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def fill(url: str, n: int, orchestrators: int = 1, expired_fraction: float = 0.0) -> list[Any]:
    """n queued rows spread over orchestrators, set-based (fast); some with expired leases."""
    pool = open_pool(url, FILL_SETTINGS, max_size=2)
    orchs = [
        register(pool, org_id="bench", linear_user_id=f"u{i}", name=f"m{i}") for i in range(orchestrators)
    ]
    with transaction(pool) as tx:
        for o in orchs:
            per = n // orchestrators
            tx.execute(
                "WITH s AS (INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, issue_id)"
                " SELECT 'bench', %(o)s, 'queued', 'i' || g FROM generate_series(1, %(n)s) g RETURNING id)"
                " INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload, available_at)"
                ' SELECT id, %(o)s, \'bench\', \'{"issue": {"id": "i", "identifier": "B-1"}}\','
                " now() - interval '1 hour' FROM s",
                {"o": o.id, "n": per},
            )
        tx.execute(
            "UPDATE dispatch_sessions ds SET queue_id = q.id, message_id = q.message_id"
            " FROM dispatch_queue q WHERE q.session_id = ds.id"
        )
        if expired_fraction:
            tx.execute(
                "UPDATE dispatch_queue SET attempts = 1, claim_token = gen_random_uuid(),"
                " claimed_at = now() - interval '2 hours', lease_expires_at = now() - interval '1 hour'"
                " WHERE id IN (SELECT id FROM dispatch_queue ORDER BY random() LIMIT %(k)s)",
                {"k": int(n * expired_fraction)},
            )
    with pool.connection() as conn:
        conn.execute("VACUUM ANALYZE dispatch_queue")
        conn.execute("VACUUM ANALYZE dispatch_sessions")
    pool.close()
    return orchs


def drain_rate(url: str, n: int, claimers: int, batch: int) -> float:
    """Claim + batch-ack of n pre-filled rows of one orchestrator by `claimers` threads: messages/s."""
    [orch] = fill(url, n)
    pool = open_pool(url, SETTINGS, min_size=claimers, max_size=claimers + 2)
    remaining = [n]
    lock = threading.Lock()
    done = [0] * claimers

    def loop(i: int) -> None:
        while True:
            got = claim(pool, orch.id, max=batch, lease_seconds=600)
            if not got:
                with lock:
                    if remaining[0] <= 0:
                        return
                continue
            ack_many(pool, orch.id, [AckItem(m.queue_id, m.claim_token) for m in got])
            done[i] += len(got)
            with lock:
                remaining[0] -= len(got)

    ts = [threading.Thread(target=loop, args=(i,)) for i in range(claimers)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    pool.close()
    return sum(done) / elapsed


def empty_claim_db_us(url: str, samples: int = 300) -> dict[str, float]:
    """Database execution time of an empty claim (EXPLAIN ANALYZE), generic and custom plans."""
    fill(url, 20000, orchestrators=4)
    pool = open_pool(url, SETTINGS, max_size=2)
    idle = register(pool, org_id="bench", linear_user_id="idle", name="idle")
    out: dict[str, float] = {}
    for mode in ("force_custom_plan", "force_generic_plan"):
        with pool.connection() as conn:
            conn.execute(f"SET plan_cache_mode = {mode}")
            times = []
            for _ in range(samples):
                with conn.transaction():
                    plan = conn.execute(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + query_with_limit("claim", 10),
                        {"orchestrator_id": idle.id, "max": 10, "lease_seconds": 60, "now": None},
                        prepare=True,
                    ).fetchone()
                assert plan is not None
                p = plan["QUERY PLAN"][0]
                times.append(p["Execution Time"] + p.get("Planning Time", 0.0))
            times.sort()
            out[mode] = times[len(times) // 2] * 1000.0
    # wall time of the whole empty claim statement round trip, as a client sees it
    t0 = time.perf_counter()
    for _ in range(samples):
        claim(pool, idle.id, max=10, lease_seconds=60)
    out["client_round_trip_us"] = (time.perf_counter() - t0) / samples * 1e6
    pool.close()
    return out


def scaling(url_for: Callable[[str], str], sizes: list[int]) -> list[dict[str, Any]]:
    """Claim and sweep cost at growing table sizes (1% expired leases)."""
    rows = []
    for n in sizes:
        url = url_for(f"scale{n}")
        orchs = fill(url, n, orchestrators=100, expired_fraction=0.01)
        pool = open_pool(url, SETTINGS, max_size=2)
        t0 = time.perf_counter()
        k = 200
        for i in range(k):
            got = claim(pool, orchs[i % len(orchs)].id, max=1, lease_seconds=600)
            assert got
        claim_ms = (time.perf_counter() - t0) / k * 1000
        t0 = time.perf_counter()
        result = sweep(pool, SETTINGS, now=datetime.now(UTC) + timedelta(seconds=1))
        sweep_ms = (time.perf_counter() - t0) * 1000
        with pool.connection() as conn:
            size = conn.execute("SELECT pg_total_relation_size('dispatch_queue') AS b").fetchone()
        rows.append(
            {
                "rows": n,
                "claim_ms": round(claim_ms, 3),
                "sweep_ms": round(sweep_ms, 1),
                "expired": result.requeued + result.dead_lettered,
                "sweep_us_per_expired": round(sweep_ms * 1000 / max(1, result.requeued), 1),
                "table_mb": round((size["b"] if size else 0) / 2**20, 1),
            }
        )
        pool.close()
    return rows


def bloat_after_cycles(url: str, cycles: int) -> dict[str, Any]:
    """Table and index size after many enqueue -> claim -> ack cycles (the hot table stays small)."""
    pool = open_pool(url, SETTINGS, min_size=4, max_size=6)
    orch = register(pool, org_id="bench", linear_user_id="u", name="m")
    batch = 500
    done = 0
    t0 = time.monotonic()
    rates = []
    while done < cycles:
        with transaction(pool) as tx:
            tx.execute(
                "WITH s AS (INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, issue_id)"
                " SELECT 'bench', %(o)s, 'queued', 'i' FROM generate_series(1, %(n)s) RETURNING id)"
                " INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload)"
                ' SELECT id, %(o)s, \'bench\', \'{"issue": {"id": "i"}}\' FROM s',
                {"o": orch.id, "n": batch},
            )
            tx.execute(
                "UPDATE dispatch_sessions ds SET queue_id = q.id, message_id = q.message_id"
                " FROM dispatch_queue q WHERE q.session_id = ds.id"  # this round only: the queue holds nothing else
            )
        t1 = time.monotonic()
        while got := claim(pool, orch.id, max=100, lease_seconds=600):
            ack_many(pool, orch.id, [AckItem(m.queue_id, m.claim_token) for m in got])
        rates.append(batch / (time.monotonic() - t1))
        done += batch
    with pool.connection() as conn:
        size = conn.execute(
            "SELECT pg_total_relation_size('dispatch_queue') AS b,"
            " pg_relation_size('dispatch_queue_claim_idx') AS i"
        ).fetchone()
    pool.close()
    assert size is not None
    head = sum(rates[:5]) / min(5, len(rates))
    tail = sum(rates[-5:]) / min(5, len(rates))
    return {
        "cycles": done,
        "seconds": round(time.monotonic() - t0, 1),
        "queue_table_kb": size["b"] // 1024,
        "claim_index_kb": size["i"] // 1024,
        "drain_rate_first": round(head),
        "drain_rate_last": round(tail),
    }


def drain_where(url: str, n: int, batch: int = 10, samples: int = 200) -> dict[str, Any]:
    """Where one claimer's drain at `batch` spends its time, per batch: the wall time of `claim`
    and of `ack_many` as the client sees them, the client's own CPU (this process: the library,
    psycopg, the messages it builds), and each statement's execution inside Postgres (EXPLAIN
    ANALYZE of the same statements on the same rows, in a transaction rolled back). What is left
    of the wall time is the round trip and the commit (the WAL flush) of each statement."""
    [orch] = fill(url, n)
    pool = open_pool(url, SETTINGS, min_size=1, max_size=1)  # (one connection: the trigger's figures)
    try:
        with lend(pool) as conn:
            conn.execute("SET track_functions = 'pl'")  # (a superuser's setting, as in enqueue_cpu_ms)
        walls = {"claim": 0.0, "ack": 0.0}
        batches = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while True:
            a = time.perf_counter()
            got = claim(pool, orch.id, max=batch, lease_seconds=600)
            b = time.perf_counter()
            if not got:
                break
            ack_many(pool, orch.id, [AckItem(m.queue_id, m.claim_token) for m in got])
            walls["claim"] += b - a
            walls["ack"] += time.perf_counter() - b
            batches += 1
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - t0
        trigger = _invariant_trigger_totals(pool, url)
        [again] = fill(url, samples * batch)
        executed: dict[str, list[float]] = {"claim": [], "ack": []}
        with pool.connection() as conn:
            for _ in range(samples):
                with conn.transaction(force_rollback=True):
                    claimed = conn.execute(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + query_with_limit("claim", batch),
                        {"orchestrator_id": again.id, "max": batch, "lease_seconds": 600, "now": None},
                    ).fetchone()
                    assert claimed is not None
                    executed["claim"].append(claimed["QUERY PLAN"][0]["Execution Time"])
                    rows = conn.execute(
                        "SELECT id, claim_token FROM dispatch_queue WHERE orchestrator_id = %s"
                        " AND lease_expires_at IS NOT NULL",
                        (again.id,),
                    ).fetchall()
                    acked = conn.execute(
                        "EXPLAIN (ANALYZE, FORMAT JSON) " + query("ack"),
                        {
                            "orchestrator_id": again.id,
                            "queue_ids": [r["id"] for r in rows],
                            "claim_tokens": [r["claim_token"] for r in rows],
                            "public_url": None,
                        },
                    ).fetchone()
                    assert acked is not None
                    executed["ack"].append(acked["QUERY PLAN"][0]["Execution Time"])
    finally:
        pool.close()
    per = max(1, batches)
    return {
        "batch": batch,
        "msg_per_s": round(n / wall),
        "wall_ms_per_batch": {k: round(v / per * 1000, 3) for k, v in walls.items()},
        "client_cpu_ms_per_batch": round(cpu / per * 1000, 3),
        "postgres_exec_ms_per_batch": {k: round(statistics.median(v), 3) for k, v in executed.items()},
        # the invariant's deferred trigger, at each commit (not in EXPLAIN's figure): its calls and
        # its function's own time per batch
        "invariant_trigger_per_batch": {
            "calls": round(trigger[0] / per, 1),
            "ms": round(trigger[1] / per, 3),
        },
    }
