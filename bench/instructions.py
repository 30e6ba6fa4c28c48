"""Instructions per request, counted by callgrind: the one figure here this noisy host repeats.

Seconds and rates move by a fifth from run to run on a shared machine; the number of instructions a
process executes for the same work moves by about 1 % (valgrind's callgrind counts them, whatever
else the machine is doing). Counted in-process, on the client side of the database only:

- `empty_claim`: a poll that finds nothing, through the served WSGI app (`functions.app.wsgi`);
- `webhook`: a signed Issue assignment dispatched through the same app;
- `enqueue`: the library's `enqueue_dispatch` in its own transaction (what `core.enqueue_rate` runs).

Each is counted as (a run with n requests) minus (the same run with none), divided by n, after the
same warm-up in both, so imports, connecting and the first statements' preparation cancel out.
Postgres's own work is not in it (another process).

    python -m bench.instructions [--n N]    (needs valgrind; the database as bench/db.py finds it)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECRET, ADMIN = "bench-secret", "bench-admin"
MODES = ("empty_claim", "webhook", "enqueue")
WARMUP = 200
_COLLECTED = re.compile(r"Collected : (\d+)")


def available() -> bool:
    return shutil.which("valgrind") is not None


def per_request(db_url: str, n: int) -> dict[str, int]:
    """Instructions per request of each mode, on `db_url` (a migrated database this may write to)."""
    from bench.core import SETTINGS
    from shared.fleet.orchestrators import register
    from shared.plumbing.db import open_pool

    pool = open_pool(db_url, SETTINGS, max_size=2)
    try:
        # The poller has no work (its polls stay empty); the webhooks go to another machine.
        poller = register(pool, org_id="bench", linear_user_id="poller", name="poller").token
        register(pool, org_id="bench", linear_user_id="assignee", name="assignee")
    finally:
        pool.close()
    # Six single-threaded valgrind runs, two at a time (one per core): a count does not depend on
    # what else runs beside it.
    with ThreadPoolExecutor(max_workers=2) as ex:
        runs = {(m, k): ex.submit(_instructions, db_url, m, poller, k) for m in MODES for k in (0, n)}
        return {m: round((runs[m, n].result() - runs[m, 0].result()) / n) for m in MODES}


def _instructions(db_url: str, mode: str, token: str, n: int) -> int:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_url,
        "DEVPILOT_ADMIN_TOKEN": ADMIN,
        "LINEAR_WEBHOOK_SECRET": SECRET,
        "BENCH_POLLER_TOKEN": token,
    }
    valgrind = shutil.which("valgrind")
    assert valgrind is not None, "valgrind not found (instructions.available())"
    out = subprocess.run(
        [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "bench.instructions",
            "--child",
            mode,
            str(n),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:  # (the child's own error, not valgrind's banner, is what says why)
        said = "\n".join(line for line in out.stderr.splitlines() if not line.startswith("=="))
        raise RuntimeError(f"{mode} under callgrind exited {out.returncode}:\n{said[-2000:]}")
    found = _COLLECTED.search(out.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count for {mode}: {out.stderr[-500:]}")
    return int(found.group(1))


def _child(mode: str, n: int) -> None:
    """Runs under callgrind: WARMUP requests, then n more, all answered 200 (or the run fails)."""
    request = {"empty_claim": _served, "webhook": _served, "enqueue": _enqueue}[mode](mode)
    for _ in range(WARMUP + n):
        request()


def _served(mode: str) -> Callable[[], None]:
    """One request of `mode` through the served WSGI app, as `devpilot serve` hands it over."""
    import logging

    from functions.app import wsgi
    from shared.linear.webhooks import sign

    logging.disable(logging.INFO)  # the request log's lines are not what is counted
    token = os.environ["BENCH_POLLER_TOKEN"]

    def call(path: str, body: bytes, headers: dict[str, str]) -> None:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8080",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
            "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
            "HTTP_HOST": "127.0.0.1:8080",
            **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()},
        }
        statuses: list[str] = []
        wsgi(environ, lambda status, _headers, _exc=None: statuses.append(status))  # type: ignore[arg-type,misc]
        if not statuses[0].startswith("200"):
            raise RuntimeError(f"{path} answered {statuses[0]}")

    def empty_claim() -> None:
        call("/claim", b'{"max": 1}', {"Authorization": f"Bearer {token}"})

    def webhook() -> None:
        from bench.loadgen import assignment

        body = json.dumps(assignment(uuid.uuid4().hex, "B-1", "assignee")).encode()
        call("/webhook", body, {"Linear-Signature": sign(SECRET, body), "Linear-Delivery": uuid.uuid4().hex})

    return empty_claim if mode == "empty_claim" else webhook


def _enqueue(_mode: str) -> Callable[[], None]:
    from bench.core import SETTINGS, enqueuer
    from shared.plumbing.db import open_pool

    pool = open_pool(os.environ["DATABASE_URL"], SETTINGS, max_size=1)
    return enqueuer(pool, f"enqueue-{uuid.uuid4()}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.instructions")
    ap.add_argument("--n", type=int, default=1000, help="requests counted per mode (default 1000)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], int(args.child[1]))
        return 0
    if not available():
        print("valgrind not found: nothing counted", file=sys.stderr)
        return 2
    from bench.db import BenchServer

    server = BenchServer()
    try:
        started = time.monotonic()
        counts = per_request(server.fresh("instr"), args.n)
    finally:
        server.close()
    print(json.dumps({"instructions_per_request": counts, "seconds": round(time.monotonic() - started)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
