"""bench/routing: what routing by repository costs (issue 46), on fresh databases of one server.

    bench/.venv/bin/python -m bench.routing [--rounds 3] [--n 2000] [--latency-n 100] [--linear-ms 0]

1. **The one-machine path is unchanged**: the webhook's one statement for an agent session's start
   (`route_and_start_agent_sessions_many_for_delivery` with one element: the single statement was
   folded into it in issue 61; an issue's start is the group commit's statement since issue 48) as
   this commit has it (its routing read also compares the
   user's machines) against the statement of the commit before routing by repository
   (e1de21c, read from git), run alternately round by round on one database, one client, by the
   library (`statement()`): mean µs per start, for a user with one machine and with two alike.
2. **The webhook through `devpilot serve`**: server CPU per dispatched webhook for one machine and
   for two alike machines (the same statement), and per webhook that writes a routing request
   (two machines that differ: the one statement writes nothing, then the intake transaction).
3. **The Linear-assisted path's latency**: webhook sent -> claimed by the machine that has the
   repository (its long-poll, woken by the enqueue's NOTIFY), against a local stand-in Linear that
   answers `issueRepositorySuggestions` after `--linear-ms`; beside it, the one-machine path
   measured the same way. Linear's own latency (hundreds of ms in production) adds to the first.

A measurement for this feature, not part of bench/run (it takes about a minute).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import psycopg
from psycopg.types.json import Jsonb

from bench import cpu
from bench.db import BenchServer
from bench.http import ADMIN, ROOT, SECRET, Serve
from bench.loadgen import assignment
from shared.linear.webhooks import sign
from shared.plumbing import sql as named
from shared.plumbing.db import open_pool, statement
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query

BASE = "e1de21c"  # the commit before routing by repository
KEY = "dGVzdHMtb25seS1lbmNyeXB0aW9uLWtleS0zMmJ5dGU="  # a Fernet key for the bench's throw-away data
BACKEND = {"hostname": "github.com", "fullName": "acme/backend"}
WEB = {"hostname": "github.com", "fullName": "acme/web"}


def base_statement(name: str) -> str:
    """A named statement as the base commit had it (its queries files, read from git)."""
    git = shutil.which("git") or "git"

    def show(*args: str) -> str:
        return subprocess.run([git, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout

    texts: dict[str, str] = {}
    for f in show("ls-tree", "--name-only", f"{BASE}:shared/queries/").split():
        if f.endswith(".sql"):
            named.parse(show("show", f"{BASE}:shared/queries/{f}"), into=texts)
    return named.resolve(texts)[name]


def one_statement(db_url: str, rounds: int, n: int) -> dict[str, Any]:
    """Mean µs per start of each version of the statement, alternating, for one machine and two
    alike. The same database: each version writes its own rows."""
    from shared.fleet.machines import Repository, describe
    from shared.fleet.orchestrators import register

    settings = Settings()
    versions = {
        "now": (query("route_and_start_agent_sessions_many_for_delivery"), _batch_params),
        "base": (base_statement("route_and_start_agent_session_for_delivery"), _start_params),
    }
    out: dict[str, dict[str, list[float]]] = {}
    with open_pool(db_url, settings, min_size=1, max_size=1) as pool:
        users = {"one machine": "solo", "two alike": "pair"}
        for user in users.values():
            for i in range(1 if user == "solo" else 2):
                m = register(pool, org_id="bench", linear_user_id=user, name=f"{user}-{i}")
                describe(pool, m.id, [Repository("github.com", "acme/backend")], [])
        for r in range(rounds):
            for label, user in users.items():
                for version, (text, make_params) in versions.items():
                    times = []
                    for i in range(n + 50):
                        params = make_params(user, f"{version}-{label}-{r}-{i}")
                        t0 = time.perf_counter()
                        with statement(pool) as tx:
                            row = tx.one(text, params)  # type: ignore[arg-type]
                        if i >= 50:  # (warm: prepared, cached)
                            times.append(time.perf_counter() - t0)
                        assert row is not None and row["outcome"] == "dispatched", row
                    out.setdefault(label, {}).setdefault(version, []).append(statistics.fmean(times) * 1e6)
            print(
                f"round {r + 1}: "
                + json.dumps({k: {v: round(x[-1], 1) for v, x in d.items()} for k, d in out.items()}),
                flush=True,
            )
    return {
        label: {version: round(statistics.median(xs), 1) for version, xs in d.items()}
        for label, d in out.items()
    }


def _batch_params(user: str, key: str) -> dict[str, Any]:
    """The agent sessions' starts statement's parameters for one start (`_start_params`'s)."""
    one = _start_params(user, key)
    element = {
        "n": 0,
        **{k: one[k] for k in ("org_id", "route_user", "delivery_key", "content_key", "issue_id")},
        **{k: one[k] for k in ("issue_identifier", "agent_session_id")},
        "session_id": str(one["session_id"]),
        "payload": one["payload"].obj,
    }
    return {"batch": Jsonb([element]), "now": None, "unroutable": "no machine"}


def _start_params(user: str, key: str) -> dict[str, Any]:
    return {
        "session_id": uuid.uuid4(),
        "issue_id": key,
        "issue_identifier": "B-1",
        "agent_session_id": f"agent-session:{key}",
        "kind": "start",
        "payload": Jsonb({"issue": {"id": key}, "kind": "start"}),
        "now": None,
        "org_id": "bench",
        "route_user": user,
        "linear_user_id": user,
        "delivery_key": f"delivery:{key}",
        "content_key": f"content:{key}",
        "record_unrouted": True,
        "notice_queued": False,
    }


class StandInLinear:
    """Answers `issueRepositorySuggestions` (the issue id says which repository: `…-backend` or
    `…-web`) after `delay` seconds, and every mutation at once."""

    def __init__(self, delay: float) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                variables = body.get("variables") or {}
                if "issueRepositorySuggestions" in body["query"]:
                    time.sleep(outer.delay)
                    name = "acme/backend" if str(variables["issueId"]).endswith("backend") else "acme/web"
                    data: dict[str, Any] = {
                        "issueRepositorySuggestions": {
                            "suggestions": [
                                {"repositoryFullName": name, "hostname": "github.com", "confidence": 0.9}
                            ]
                        }
                    }
                else:
                    data = {"agentActivityCreate": {"success": True, "agentActivity": {"id": "a"}}}
                answer = json.dumps({"data": data}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.delay = delay
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/graphql"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def _serve(db_url: str, linear: StandInLinear) -> Serve:
    s = Serve(db_url, {"LINEAR_API_URL": linear.url, "DEVPILOT_ENCRYPTION_KEYS": KEY})
    r = httpx.post(
        s.url + "/linear-credentials",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"orgId": "bench", "accessToken": "lin-bench"},
    )
    assert r.status_code == 200, r.text
    return s


def _machine(s: Serve, user: str, name: str, repos: list[dict[str, str]]) -> str:
    r = httpx.post(
        s.url + "/orchestrators",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"orgId": "bench", "linearUserId": user, "name": name},
    ).json()
    token = str(r["token"])
    said = httpx.post(
        s.url + "/machine", headers={"Authorization": f"Bearer {token}"}, json={"repositories": repos}
    )
    assert said.status_code == 200, said.text
    return token


def _send(c: httpx.Client, event: dict[str, object]) -> dict[str, Any]:
    body = json.dumps(event).encode()
    r = c.post(
        "/webhook",
        content=body,
        headers={"Linear-Signature": sign(SECRET, body), "Linear-Delivery": uuid.uuid4().hex},
    )
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def server_cpu(db_url: str, linear: StandInLinear, n: int) -> dict[str, float]:
    """Server CPU per webhook (ms): one machine; two alike; two that differ (a routing request is
    written; its routing after the commit is counted too, as the server's own CPU)."""
    s = _serve(db_url, linear)
    out: dict[str, float] = {}
    try:
        _machine(s, "solo", "solo", [BACKEND])
        _machine(s, "pair", "pair-1", [BACKEND, WEB])
        _machine(s, "pair", "pair-2", [WEB, BACKEND])
        _machine(s, "split", "split-backend", [BACKEND])
        _machine(s, "split", "split-web", [WEB])
        with httpx.Client(base_url=s.url, timeout=30) as c:
            for label, user, status in (
                ("one_machine", "solo", "dispatched"),
                ("two_alike", "pair", "dispatched"),
                ("two_differ", "split", "routing"),
            ):
                for i in range(50):
                    _send(c, assignment(f"warm-{label}-{i}-backend", "W-1", user))
                time.sleep(1.0)  # (the routing of the warm-up is done)
                before = cpu.tree_seconds(s.proc.pid)
                for i in range(n):
                    assert _send(c, assignment(f"{label}-{i}-backend", "C-1", user))["status"] == status
                if status == "routing":
                    _wait_routed(db_url, n + 50)
                out[label] = round((cpu.tree_seconds(s.proc.pid) - before) / n * 1000, 3)
    finally:
        s.close()
    return out


def _wait_routed(db_url: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(db_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM routing_requests WHERE done_at IS NOT NULL").fetchone()
            if row is not None and row[0] >= n:
                return
            time.sleep(0.05)
    raise AssertionError("the routing requests were not all done in time")


def latency(db_url: str, linear: StandInLinear, n: int) -> dict[str, dict[str, float]]:
    """Webhook sent -> claimed by the right machine's long-poll, ms: one machine; two that differ
    (the Linear-assisted path), for a plain issue and for an agent session's start."""
    s = _serve(db_url, linear)
    try:
        solo = _machine(s, "solo", "solo", [BACKEND])
        backend = _machine(s, "split", "split-backend", [BACKEND])
        web = _machine(s, "split", "split-web", [WEB])
        cases = {
            "one_machine": ("solo", {"backend": solo, "web": solo}),
            "by_repository": ("split", {"backend": backend, "web": web}),
        }
        out: dict[str, dict[str, float]] = {}
        with httpx.Client(base_url=s.url, timeout=60) as c:
            for label, (user, tokens) in cases.items():
                samples = []
                for i in range(n + 5):
                    which = "backend" if i % 2 else "web"
                    got: list[float] = []
                    waiter = threading.Thread(target=_long_poll, args=(s.url, tokens[which], got))
                    waiter.start()
                    time.sleep(0.05)  # (the long-poll is waiting)
                    t0 = time.perf_counter()
                    _send(c, assignment(f"lat-{label}-{i}-{which}", "L-1", user))
                    waiter.join(timeout=30)
                    assert got, f"{label}: not claimed"
                    if i >= 5:
                        samples.append((got[0] - t0) * 1000)
                samples.sort()
                out[label] = {
                    "p50_ms": round(samples[len(samples) // 2], 1),
                    "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 1),
                }
                print(f"latency {label}: {out[label]}", flush=True)
        return out
    finally:
        s.close()


def _long_poll(url: str, token: str, got: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            r = c.post(
                "/claim", json={"max": 1, "waitSeconds": 5}, headers={"Authorization": f"Bearer {token}"}
            )
            messages = r.json()["messages"]
            if messages:
                got.append(time.perf_counter())
                m = messages[0]
                c.post("/ack", json={"queueId": m["queueId"], "claimToken": m["claimToken"]},
                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
                return


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench.routing")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000, help="starts per version per round; webhooks per kind")
    ap.add_argument("--latency-n", type=int, default=100)
    ap.add_argument("--linear-ms", type=float, default=0.0, help="the stand-in Linear's answer time")
    args = ap.parse_args()
    db = BenchServer()
    linear = StandInLinear(args.linear_ms / 1000)
    try:
        result = {
            "one_statement_us": one_statement(db.fresh("route"), args.rounds, args.n),
            "server_cpu_ms_per_webhook": server_cpu(db.fresh("route_cpu"), linear, args.n),
            "webhook_to_claimed": latency(db.fresh("route_lat"), linear, args.latency_n),
            "linear_ms": args.linear_ms,
            "postgres": db.version,
        }
    finally:
        linear.close()
        db.close()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
