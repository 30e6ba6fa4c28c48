"""bench/servers: the same WSGI app (`functions.app:wsgi`) under `devpilot serve` (gunicorn, its
gthread worker) and under granian (HTTP parsed in Rust, the app on a pool of Python threads),
alternating round by round on fresh databases of one server: server CPU per request for each.

    bench/.venv/bin/python -m bench.servers [--rounds 3] [--n 3000]

A measurement for choosing the production server, not part of bench/run: granian is installed in
the bench's environment only; the product does not depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import httpx

from bench.db import BenchServer
from bench.http import ADMIN, ROOT, SECRET, Serve, cpu_per_request, free_port

KINDS = ("empty_claim", "webhook", "healthz")


class Granian:
    """The product's WSGI app on granian: one worker process, 32 blocking threads."""

    def __init__(self, db_url: str) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "granian", "--interface", "wsgi", "--workers", "1",
             "--blocking-threads", "32", "--host", "127.0.0.1", "--port", str(port), "--no-ws",
             "functions.app:wsgi"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": db_url, "DEVPILOT_ADMIN_TOKEN": ADMIN,
                 "LINEAR_WEBHOOK_SECRET": SECRET, "DEVPILOT_POOL_MAX": "20"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("granian did not answer /healthz")

    def register(self) -> str:
        r = httpx.post(
            self.url + "/orchestrators",
            headers={"Authorization": f"Bearer {ADMIN}"},
            json={"orgId": "bench", "linearUserId": "u", "name": "bench"},
        )
        return str(r.json()["token"])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench.servers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=3000, help="requests of each kind per round")
    args = ap.parse_args()
    db = BenchServer()
    results: dict[str, list[dict[str, float]]] = {"gunicorn": [], "granian": []}
    try:
        for r in range(args.rounds):
            s = Serve(db.fresh("srv"))
            try:
                results["gunicorn"].append(cpu_per_request(s.url, s.proc.pid, s.register()[1], args.n))
            finally:
                s.close()
            g = Granian(db.fresh("srv"))
            try:
                results["granian"].append(cpu_per_request(g.url, g.proc.pid, g.register(), args.n))
            finally:
                g.close()
            for name, rows in results.items():
                print(f"round {r + 1} {name:8} {json.dumps(rows[-1])}", flush=True)
    finally:
        db.close()
    print("server CPU per request, ms (each round):")
    for kind in KINDS:
        line = "  ".join(
            f"{name}: {' / '.join(str(x[kind]) for x in rows)}" for name, rows in results.items()
        )
        print(f"  {kind:12} {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
