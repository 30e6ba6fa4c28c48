"""What the database's backends are doing while one kind of load runs: `pg_stat_activity` of the
load's database sampled every 2 ms, each state and wait event as the mean number of backends in it.

    python -m bench.waits KIND [SECONDS]

KIND: one of the load generator's webhook kinds (`bench.loadgen.KINDS`) or `blend`, sent by 16
senders through `devpilot serve` on a fresh database (prepared as the paired rounds prepare it,
after the same warm-up); or `enqueue`, the library's one-statement enqueue from 16 threads. Rows
per sample add up to the backends open: `idle` / `ClientRead` waits for its client, `active` with
no wait event is on a core or waiting for one, `WALSync` flushes a commit. The webhooks' two lanes
of group commit show as at most two active backends per kind.
"""

from __future__ import annotations

import collections
import sys
import threading
from typing import Any

import psycopg

from bench import core, http
from bench.db import BenchServer
from bench.paired import WEBHOOK_KINDS, warmed_up

SENDERS = 16
EVERY = 0.002


class Sampler:
    """`pg_stat_activity` of one database, sampled on a thread of its own until `stop()`."""

    def __init__(self, admin_url: str, dbname: str) -> None:
        self.counts: collections.Counter[tuple[Any, ...]] = collections.Counter()
        self.samples = 0
        self._admin_url, self._dbname = admin_url, dbname
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            while not self._stop.wait(EVERY):
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
                    " WHERE (datname = %s AND pid <> pg_backend_pid()) OR backend_type = 'walwriter'",
                    (self._dbname,),
                ).fetchall()
                self.counts.update(rows)
                self.samples += 1

    def stop(self) -> dict[str, float]:
        """Each (state, wait event type, wait event) as the mean number of backends in it."""
        self._stop.set()
        self._thread.join()
        n = max(1, self.samples)
        return {" / ".join(str(x) for x in k): round(v / n, 3) for k, v in self.counts.most_common()}


def _dbname(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def waits(s: BenchServer, kind: str, seconds: float) -> dict[str, Any]:
    db = s.fresh("waits")
    if kind == "enqueue":
        sampler = Sampler(s.admin_url, _dbname(db))
        rate = core.enqueue_rate(db, SENDERS, seconds, one_statement=True)
        return {"kind": kind, "rate": round(rate), "backends": sampler.stop()}
    server = http.Serve(db)
    try:
        warmed_up(server, SENDERS, seconds, 0)
        sampler = Sampler(s.admin_url, _dbname(db))
        out = http.loadgen("webhook", server.url, http.SECRET, SENDERS, seconds, kind, "r0")
        return {"kind": kind, "rate": round(out["rate"]), "p50_ms": out["p50_ms"], "backends": sampler.stop()}
    finally:
        server.close()


def main(argv: list[str]) -> None:
    kind = argv[0] if argv else "created"
    if kind not in (*WEBHOOK_KINDS, "enqueue"):
        raise SystemExit(f"KIND: one of {', '.join((*WEBHOOK_KINDS, 'enqueue'))}")
    s = BenchServer()
    try:
        result = waits(s, kind, float(argv[1]) if len(argv) > 1 else 3.0)
    finally:
        s.close()
    print(
        f"{result['kind']}: {result['rate']:,}/s"
        + (f", p50 {result['p50_ms']} ms" if "p50_ms" in result else "")
    )
    for what, backends in result["backends"].items():
        print(f"  {backends:6.3f}  {what}")


if __name__ == "__main__":
    main(sys.argv[1:])
