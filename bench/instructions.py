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
    if mode.startswith("kind:"):  # (under valgrind a cold first request takes seconds, and the
        # bodies, made first, grow old)
        env |= {"DEVPILOT_REQUEST_DEADLINE_SECONDS": "60", "DEVPILOT_WEBHOOK_TOLERANCE_SECONDS": "86400"}
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
    if mode.startswith("kind:"):
        _, kind, tag, total = mode.split(":")
        _kind(kind, tag, n, int(total))
        return
    request = {"empty_claim": _served, "webhook": _served, "enqueue": _enqueue}[mode](mode)
    for _ in range(WARMUP + n):
        request()


def _call(wsgi: Any, path: str, body: bytes, headers: dict[str, str]) -> tuple[str, bytes]:
    """One POST through the served WSGI app (`wsgi`), as `devpilot serve` hands it over: its
    status and its body."""
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
    answer = wsgi(environ, lambda status, _headers, _exc=None: statuses.append(status))
    return statuses[0], b"".join(answer)


def _served(mode: str) -> Callable[[], None]:
    """One request of `mode` through the served WSGI app."""
    import logging

    from functions.app import wsgi
    from shared.linear.webhooks import sign

    logging.disable(logging.INFO)  # the request log's lines are not what is counted
    token = os.environ["BENCH_POLLER_TOKEN"]

    def call(path: str, body: bytes, headers: dict[str, str]) -> None:
        status, _ = _call(wsgi, path, body, headers)
        if not status.startswith("200"):
            raise RuntimeError(f"{path} answered {status}")

    def empty_claim() -> None:
        call("/claim", b'{"max": 1}', {"Authorization": f"Bearer {token}"})

    def webhook() -> None:
        from bench.loadgen import assignment

        body = json.dumps(assignment(uuid.uuid4().hex, "B-1", "assignee")).encode()
        call("/webhook", body, {"Linear-Signature": sign(SECRET, body), "Linear-Delivery": uuid.uuid4().hex})

    return empty_claim if mode == "empty_claim" else webhook


KIND_SECONDS = 0.5  # the state prepared for a kind's run: 1,500 issues to unassign, >= WARMUP + n


def per_kind(db_url: str, kinds: list[str], n: int) -> dict[str, int]:
    """Instructions per webhook of each of `kinds` (`bench.loadgen.KINDS`), on `db_url`."""
    from bench import http
    from bench import loadgen as lg
    from bench.core import SETTINGS
    from shared.fleet.orchestrators import register
    from shared.plumbing.db import open_pool

    if WARMUP + n > lg.prepared("unassigned", 1, KIND_SECONDS)["unassigned"]:
        raise ValueError(f"n={n}: more than the issues prepared to unassign")
    pool = open_pool(db_url, SETTINGS, max_size=2)
    try:
        machine_a = register(pool, org_id=lg.ORG, linear_user_id=lg.USER_A, name="a").id
        register(pool, org_id=lg.ORG, linear_user_id=lg.USER_B, name="b")
    finally:
        pool.close()
    http.prepare(db_url, [(k, f"{k}{m}", KIND_SECONDS) for k in kinds for m in (0, n)], 1, machine_a)
    with ThreadPoolExecutor(max_workers=2) as ex:
        runs = {
            (k, m): ex.submit(_instructions, db_url, f"kind:{k}:{k}{m}:{n}", "", m)
            for k in kinds
            for m in (0, n)
        }
        return {k: round((runs[k, n].result() - runs[k, 0].result()) / n) for k in kinds}


def _kind(kind: str, tag: str, n: int, total: int) -> None:
    """WARMUP webhooks of `kind`, then n more, each answered as the load generator requires; the
    bodies of WARMUP + `total` made and signed first, in every run alike."""
    import logging

    from bench import loadgen as lg
    from functions.app import wsgi
    from functions.runtime import current
    from shared.linear.webhooks import sign

    logging.disable(logging.INFO)
    nxt = lg.bodies(kind, tag, 0, 1, KIND_SECONDS)
    bodies = [
        (k, b, {"Linear-Signature": sign(SECRET, b), "Linear-Delivery": uuid.uuid4().hex})
        for k, b in (nxt() for _ in range(WARMUP + total))
    ]
    for k, body, headers in bodies[: WARMUP + n]:
        status, answer = _call(wsgi, "/webhook", body, headers)
        lg.check(k, int(status[:3]), answer)
    runtime = current()
    if runtime is not None:  # (the notices posted after commit: their work counted too)
        runtime.service._sender.shutdown(wait=True)


def _enqueue(_mode: str) -> Callable[[], None]:
    from bench.core import SETTINGS, enqueuer
    from shared.plumbing.db import open_pool

    pool = open_pool(os.environ["DATABASE_URL"], SETTINGS, max_size=1)
    return enqueuer(pool, f"enqueue-{uuid.uuid4()}")


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.instructions")
    ap.add_argument("--n", type=int, default=1000, help="requests counted per mode (default 1000)")
    ap.add_argument("--kinds", help="webhook kinds of bench.loadgen to count instead, comma-separated")
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
        db = server.fresh("instr")
        counts = per_kind(db, args.kinds.split(","), args.n) if args.kinds else per_request(db, args.n)
    finally:
        server.close()
    print(json.dumps({"instructions_per_request": counts, "seconds": round(time.monotonic() - started)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
