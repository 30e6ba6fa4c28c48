"""The slowest statement of each kind the service sends, on a large table: the figure the server-side
limits (DEVPILOT_STATEMENT_TIMEOUT_MS, DEVPILOT_LOCK_TIMEOUT_MS) must leave room above.

`python -m bench.statements [--rows N]` (default 1,000,000: the bench's largest scale, 100 machines
of 10,000 queued rows each, 1 % of them with expired leases). Every named statement of
`shared/queries` that the run sends is timed as the client sees it (send to last row, so the round
trip is in it), with the server's limits off so that a slow one shows its true time. The run sends
what the service sends: webhooks of every kind through the intake, long claims and batch acks,
a release, the sweep over the expired leases (its batches of 1,000), the retention prune, the
operators' snapshot, and the revoke of a machine holding 10,000 queued starts (all cancelled in one
transaction: the largest single write the service makes).

`python -m bench.statements --sessions N [--url URL]`: a year in production instead
(`bench/year.py`): N kept sessions and all around them (10,000,000: what a busy deployment keeps
over DEVPILOT_RETENTION_DAYS=90), and what the service does with them, the sweep's retention, the
dashboard, `devpilot status`, a session's page and the searches included; JIT off, as the service
connects. Each statement against a quarter of the statement timeout (500 ms of 2 s);
`bench/results/statements-year.json`. `--url`: an existing database already seeded with N
(building 10,000,000 takes most of an hour on a 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench import core
from bench.db import BenchServer
from bench.loadgen import assignment, edit
from shared.delivery import intake, queue
from shared.delivery.queue import AckItem, revoke
from shared.fleet.orchestrators import hash_token, register
from shared.linear import webhooks as linear
from shared.operators import status
from shared.plumbing.db import open_pool
from shared.plumbing.settings import Settings
from shared.plumbing.sql import load, query_with_limit

# The service's settings with the server's limits and the client's deadlines out of the way.
UNBOUND = Settings(
    DEVPILOT_POOL_MAX=4,
    DEVPILOT_STATEMENT_TIMEOUT_MS=600_000,
    DEVPILOT_LOCK_TIMEOUT_MS=600_000,
    DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS=600_000,
    DEVPILOT_SWEEP_DEADLINE_SECONDS=3600,
    DEVPILOT_REQUEST_DEADLINE_SECONDS=60,
)


RESULT = Path(__file__).parent / "results" / "statements.json"
YEAR_RESULT = Path(__file__).parent / "results" / "statements-year.json"
QUARTER_MS = 2000 / 4  # a quarter of DEVPILOT_STATEMENT_TIMEOUT_MS's default


class Timings:
    """Wraps `psycopg.Cursor.execute` to time each named statement (looked up by its text)."""

    def __init__(self) -> None:
        self.names = {text: name for name, text in load().items()}
        for name, text in load().items():  # (the claims' LIMIT is written in: each ceiling's text)
            if "%(max_ceiling)s" in text:
                for k in range(11):
                    self.names[query_with_limit(name, 1 << k)] = name
        self.ms: dict[str, list[float]] = defaultdict(list)
        self._original = psycopg.Cursor.execute

    def __enter__(self) -> Timings:
        original, names, ms = self._original, self.names, self.ms

        def timed(cur: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(cur, query, params, **kw)
            finally:
                name = names.get(query) if isinstance(query, str) else None
                if name is not None:
                    ms[name].append((time.perf_counter() - t0) * 1000)

        psycopg.Cursor.execute = timed  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        psycopg.Cursor.execute = self._original  # type: ignore[method-assign]

    def slowest(self) -> list[dict[str, Any]]:
        rows = [
            {
                "statement": name,
                "max_ms": round(max(v), 1),
                "median_ms": round(sorted(v)[len(v) // 2], 2),
                "n": len(v),
            }
            for name, v in self.ms.items()
        ]
        return sorted(rows, key=lambda r: -r["max_ms"])


def hook(body: dict[str, Any]) -> linear.Webhook:
    return linear.parse(json.dumps(body).encode())


def run(url: str, rows: int) -> list[dict[str, Any]]:
    orchs = core.fill(url, rows, orchestrators=100, expired_fraction=0.01)
    pool = open_pool(url, UNBOUND, max_size=4)
    try:
        with Timings() as t:
            # webhooks: starts (alone), an assignment moved (the intake transaction), ignored edits
            for i in range(50):
                user = f"u{i % 100}"
                intake.receive(pool, hook(assignment(f"st-{i}", f"B-{i}", user)), f"d-{i}")
                intake.receive(pool, hook(edit(f"st-{i}", user)), f"e-{i}")
                moved = {**assignment(f"st-{i}", f"B-{i}", f"u{(i + 1) % 100}"), "action": "update"}
                moved["updatedFrom"] = {"assigneeId": user}
                intake.receive(pool, hook(moved), f"m-{i}")
            # machines at work: a poll, long claims and batch acks, a release
            for o in orchs[:10]:
                queue.poll(pool, hash_token(o.token), max=10, lease_seconds=600)
                got = queue.claim(pool, o.id, max=100, lease_seconds=600)
                queue.ack_many(pool, o.id, [AckItem(m.queue_id, m.claim_token) for m in got[:-1]])
                last = got[-1]
                queue.release(pool, UNBOUND, o.id, last.queue_id, last.claim_token, reason="bench")
            # the sweep over every expired lease, the retention prune, the operators' snapshot
            queue.sweep(pool, UNBOUND, now=datetime.now(UTC) + timedelta(seconds=1))
            intake.prune_deliveries(pool, UNBOUND, now=datetime.now(UTC) + timedelta(days=30))
            status.snapshot(pool)
            # a machine revoked with its 10,000 queued starts (its user has no other machine)
            register(pool, org_id="bench", linear_user_id="late", name="late")
            revoke(pool, orchs[-1].id)
        return t.slowest()
    finally:
        pool.close()


def run_year(url: str, sessions: int) -> dict[str, Any]:
    """A year of kept sessions (seeded unless the database has them), then the workload, timed."""
    from bench import year
    from shared.plumbing.migrate import migrate

    settings = UNBOUND.replace(
        linear_api_url="http://127.0.0.1:9/graphql",  # (nothing listens: each post fails at once)
        encryption_keys="YmVuY2gtb25seS1lbmNyeXB0aW9uLWtleS0zMmJ5dGU=",
        retention_days=90,
    )
    migrate(url)
    pool = open_pool(url, settings, max_size=6)
    try:
        with pool.connection() as conn:
            kept = conn.execute("SELECT count(*) AS n FROM dispatch_sessions").fetchone()
        t0 = time.monotonic()
        # (a database seeded before: the sweeps' retention has forgotten the oldest since)
        made = year.found(pool) if kept is not None and kept["n"] >= sessions * 0.95 else None
        if made is None:
            made = year.seed(pool, settings, sessions, log=True)
        seeded = time.monotonic() - t0
        with Timings() as t:
            found = year.workload(pool, settings, made)
        slowest = t.slowest()
    finally:
        pool.close()
    return {
        "sessions": sessions,
        "kept_sessions": int(kept["n"]) if kept is not None and made is not None else sessions,
        "jit": "off",
        "quarter_of_timeout_ms": QUARTER_MS,
        "seed_seconds": round(seeded),
        "over_a_quarter": [r["statement"] for r in slowest if r["max_ms"] > QUARTER_MS],
        "found": {k: v for k, v in found.items() if k != "page"},
        "slowest": slowest,
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.statements")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument(
        "--sessions", type=int, default=0, help="a year of N kept sessions instead (bench/year.py)"
    )
    ap.add_argument("--url", default=None, help="with --sessions: this database (kept afterwards)")
    args = ap.parse_args()
    if args.sessions:
        server = None if args.url else BenchServer()
        try:
            url = args.url or server.fresh("year")  # type: ignore[union-attr]
            result = run_year(url, args.sessions)
        finally:
            if server is not None:
                server.close()
        print(
            f"at {args.sessions:,} kept sessions (ms, client side, JIT off; a quarter of the timeout: 500):"
        )
        for r in result["slowest"][: args.top]:
            print(f"  {r['statement']:<40} max {r['max_ms']:>8}  median {r['median_ms']:>7}  n={r['n']}")
        YEAR_RESULT.write_text(json.dumps(result, indent=1, default=str) + "\n")
        return 0 if not result["over_a_quarter"] else 1
    server = BenchServer()
    try:
        slowest = run(server.fresh("statements"), args.rows)
    finally:
        server.close()
    print(f"slowest statements at {args.rows:,} queued rows (ms, client side, limits off):")
    for r in slowest[: args.top]:
        print(f"  {r['statement']:<32} max {r['max_ms']:>8}  median {r['median_ms']:>7}  n={r['n']}")
    RESULT.write_text(json.dumps({"rows": args.rows, "slowest": slowest}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
