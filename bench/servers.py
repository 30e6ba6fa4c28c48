"""bench/servers: the same WSGI app (`functions.app:wsgi`) under `devpilot serve` (Granian: HTTP
parsed in Rust, the app on a pool of Python threads) and under gunicorn's gthread worker (the server
`devpilot serve` ran before), alternating round by round on fresh databases of one server: server
CPU per request for each.

    bench/.venv/bin/python -m bench.servers [--rounds 3] [--n 3000]

A measurement for choosing the production server, not part of bench/run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from bench.db import BenchServer
from bench.http import Serve, cpu_per_request, devpilot_serve


def gunicorn(port: int) -> list[str]:
    """The product's WSGI app on gunicorn as `devpilot serve` ran it: one gthread worker, 512 threads."""
    return [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
            "--threads", "512", "--bind", f"127.0.0.1:{port}", "--keep-alive", "5",
            "functions.app:wsgi"]  # fmt: skip


SERVERS: dict[str, Callable[[int], list[str]]] = {"devpilot serve": devpilot_serve, "gunicorn": gunicorn}


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench.servers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=3000, help="requests of each kind per round")
    args = ap.parse_args()
    db = BenchServer()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in SERVERS}
    try:
        for r in range(args.rounds):
            for name, command in SERVERS.items():
                server = Serve(db.fresh("srv"), command=command)
                try:
                    token = server.register()[1]
                    results[name].append(cpu_per_request(server.url, server.proc.pid, token, args.n))
                finally:
                    server.close()
                print(f"round {r + 1} {name:14} {json.dumps(results[name][-1])}", flush=True)
    finally:
        db.close()
    print("server CPU per request, ms (each round):")
    kinds = [k for k in next(iter(results.values()))[0] if not k.endswith("_wall_ms")]
    for kind in kinds:
        line = "  ".join(
            f"{name}: {' / '.join(str(x[kind]) for x in rows)}" for name, rows in results.items()
        )
        print(f"  {kind:12} {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
