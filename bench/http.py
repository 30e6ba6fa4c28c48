"""HTTP figures through `devpilot serve`: webhooks/s, claim+ack cycles/s, pickup latency."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg

from bench import cpu
from bench import loadgen as lg
from bench.core import FILL_SETTINGS
from bench.loadgen import assignment, edit
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import (
    AckItem,
    Routed,
    Start,
    ack_many,
    claim,
    enqueue_dispatch,
    route_and_enqueue_many,
)
from shared.linear.webhooks import sign
from shared.plumbing.db import open_pool, statement, transaction
from shared.plumbing.sql import query
from shared.wire.messages import IssueRef

ROOT = Path(__file__).resolve().parent.parent
ADMIN, SECRET = "bench-admin", "bench-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def devpilot_serve(port: int) -> list[str]:
    return [sys.executable, "-m", "devpilot", "serve", "--port", str(port), "--sweep-every", "0"]


class Serve:
    """The product's app as a server process (`devpilot serve` unless `command` says another way to
    serve it on the given port), against `db_url`, waited on until `/healthz` answers."""

    def __init__(
        self,
        db_url: str,
        env: dict[str, str] | None = None,
        command: Callable[[int], list[str]] = devpilot_serve,
    ) -> None:
        self.port = free_port()
        self.db_url = db_url
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            command(self.port),
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": db_url,
                "DEVPILOT_ADMIN_TOKEN": ADMIN,
                "LINEAR_WEBHOOK_SECRET": SECRET,
                "DEVPILOT_POOL_MAX": "20",
                **(env or {}),
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)

    def register(self, user: str = "u") -> tuple[str, str]:
        r = httpx.post(
            self.url + "/orchestrators",
            headers={"Authorization": f"Bearer {ADMIN}"},
            json={"orgId": "bench", "linearUserId": user, "name": "bench"},
        ).json()
        return r["orchestratorId"], r["token"]

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


def loadgen(
    mode: str, url: str, secret: str, threads: int, seconds: float, kind: str = "created", tag: str = "bench"
) -> dict[str, Any]:
    """One run of `bench.loadgen` (a process of its own): `kind`, for webhooks, as it takes it."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", mode, url, secret, str(threads), str(seconds), kind, tag],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # (a wrong answer, or prepared state that ran out: the bench's error)
        raise RuntimeError(f"bench.loadgen {mode} {kind} failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def machines(s: Serve) -> dict[str, tuple[UUID, str]]:
    """The bench's two machines on `s`, one for each Linear user a kind dispatches to, by Linear
    user: each one's id and token."""
    out: dict[str, tuple[UUID, str]] = {}
    for user in (lg.USER_A, lg.USER_B):
        oid, token = s.register(user)
        out[user] = (UUID(oid), token)
    return out


PREP_BATCH = 1000  # issue starts written in one statement while preparing


def prepare(db_url: str, runs: list[tuple[str, str, float]], threads: int, machine_a: UUID) -> None:
    """The state the load generator's `runs` (kind, tag, seconds) by `threads` senders expect, made
    before any of them is timed,
    through the library: each prepared agent session (prompted, stop) a start delivered to USER_A's
    machine `machine_a`, so that machine holds the conversation; each prepared issue (re-assigned,
    unassigned) an open assignment dispatch to it, as an earlier webhook would have left it.
    Run it before anything else is queued for that machine (its delivered starts are claimed).
    Then the database is analyzed."""
    pool = open_pool(db_url, FILL_SETTINGS, max_size=2)
    try:
        sessions = [
            lg.pool_id(tag, kind, held, i)
            for kind, tag, seconds in runs
            for held in lg.HELD
            for i in range(lg.prepared(kind, threads, seconds).get(held, 0))
        ]
        with transaction(pool) as tx:
            for sid in sessions:
                message = DispatchPayload(
                    issue=IssueRef(id=f"issue-{sid}", identifier="B-1"), agent_session_id=sid
                )
                enqueue_dispatch(
                    tx, org_id=lg.ORG, orchestrator_id=machine_a, linear_user_id=lg.USER_A, message=message
                )
        left = set(sessions)
        while left:
            got = claim(pool, machine_a, max=100, lease_seconds=600)
            if not got or any(m.agent_session_id not in left for m in got):
                raise RuntimeError("prepare: the machine's queue holds other work, or lost a start")
            ack_many(pool, machine_a, [AckItem(m.queue_id, m.claim_token) for m in got])
            left -= {m.agent_session_id for m in got}
        issues = [
            lg.pool_id(tag, kind, pool_name, i)
            for kind, tag, seconds in runs
            for pool_name, n in lg.prepared(kind, threads, seconds).items()
            if pool_name not in lg.HELD
            for i in range(n)
        ]
        for at in range(0, len(issues), PREP_BATCH):
            starts = [
                Start(
                    lg.ORG,
                    lg.USER_A,
                    DispatchPayload(issue=IssueRef(id=i, identifier="B-1", title="bench")),
                    f"prep:{i}",
                    f"prep-content:{i}",
                )
                for i in issues[at : at + PREP_BATCH]
            ]
            with statement(pool) as tx:
                routed = route_and_enqueue_many(tx, starts)
            if not all(isinstance(r, Routed) and r.orchestrator_id == machine_a for r in routed):
                raise RuntimeError("prepare: an issue's start was not queued for USER_A's machine")
    finally:
        pool.close()
    # Analyzed, as autovacuum has analyzed a service's tables by the time they hold this much: the
    # plans the server's connections keep are then made against statistics, not against none (a
    # PL/pgSQL query planned with none read every queued session in some runs: bench/README.md).
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def http_rates(db_url: str, seconds: float, threads: int) -> dict[str, Any]:
    """Webhooks/s and claim+ack cycles/s through `devpilot serve`, and where each one's CPU went
    (`cpu_ms_per_request`: the load generator, the server, Postgres; see `cpu_split`)."""
    s = Serve(db_url)
    try:
        _, token = s.register()
        hooks, hooks_cpu = cpu_split(lambda: loadgen("webhook", s.url, SECRET, threads, seconds), s.proc.pid)
        cycles, cycles_cpu = cpu_split(lambda: loadgen("cycle", s.url, token, threads, seconds), s.proc.pid)
        return {
            "webhooks": hooks,
            "claim_ack_cycles": cycles,
            "cpu_ms_per_request": {"webhooks": hooks_cpu, "claim_ack_cycles": cycles_cpu},
        }
    finally:
        s.close()


def webhook_rate(db_url: str, seconds: float, threads: int, workers: int) -> dict[str, Any]:
    """Webhooks/s through `devpilot serve` with `workers` worker processes (DEVPILOT_SERVE_WORKERS),
    and where each one's CPU went (the server's figure is its whole process tree)."""
    s = Serve(db_url, env={"DEVPILOT_SERVE_WORKERS": str(workers)})
    try:
        s.register()  # (the machine the webhooks are dispatched to)
        hooks, hooks_cpu = cpu_split(lambda: loadgen("webhook", s.url, SECRET, threads, seconds), s.proc.pid)
        return {**hooks, "workers": workers, "cpu_ms_per_request": hooks_cpu}
    finally:
        s.close()


def cpu_split(
    run: Callable[[], dict[str, Any]], server_pid: int
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """Runs one load generator (`run`, a child process: its answer counts the requests and its own
    CPU while it sent) and says what each request cost in CPU (ms) on each side of this machine: the
    load generator, the server process tree, and every Postgres process. On a small machine they
    share the cores, so this is where a rate's time went. `postgres` is None when Postgres runs
    elsewhere."""
    srv0, pg0 = cpu.tree_seconds(server_pid), cpu.postgres_by_process()
    result = run()
    srv1, pg1 = cpu.tree_seconds(server_pid), cpu.postgres_by_process()
    n = int(result["count"])
    return result, {
        "load_generator": cpu.per_unit_ms(0.0, float(result["cpu_s"]), n),
        "server": cpu.per_unit_ms(srv0, srv1, n),
        "postgres": cpu.per_unit_ms(0.0, cpu.postgres_used(pg0, pg1), n),
    }


class RealtimeRelay:
    """Supabase Realtime, locally: the Phoenix-channel stand-in the tests use, fed by a LISTEN on
    the channel an enqueue NOTIFYs on commit. So a pickup goes commit -> push -> the machine's
    /claim as it does with Supabase, minus Supabase's own WAL-to-socket delay (not measurable here,
    no network): the figure is the floor of the realtime path, not a Supabase measurement.
    Supabase reads every insert from the WAL; an enqueue NOTIFYs only a machine marked as waiting
    (as a long-poll marks it), so the relay marks the machines it follows (`follow`)."""

    def __init__(self, db_url: str) -> None:
        from tests.helpers.phoenix_standin import PhoenixStandIn

        self.standin = PhoenixStandIn()
        self.secret = "bench-realtime-" + "k" * 32
        self._stop = threading.Event()
        self._conn = psycopg.connect(db_url, autocommit=True)
        self._conn.execute("LISTEN devpilot_dispatch")
        self._thread = threading.Thread(target=self._relay, daemon=True)
        self._thread.start()

    def follow(self, orchestrator_id: str) -> None:
        """Enqueues to this machine NOTIFY for the rest of the run (a day), as during a long-poll."""
        self._conn.execute(query("mark_listening"), {"id": orchestrator_id, "seconds": 86400, "margin": 0})

    def env(self) -> dict[str, str]:
        return {
            "SUPABASE_URL": self.standin.url,
            "SUPABASE_ANON_KEY": "bench-anon",
            "SUPABASE_JWT_SECRET": self.secret,
        }

    def _relay(self) -> None:
        while not self._stop.is_set():
            for note in self._conn.notifies(timeout=0.5, stop_after=1):
                self.standin.push_insert({"orchestrator_id": note.payload, "id": str(uuid.uuid4())})

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()
        self.standin.close()


def pickup_latency(db_url: str, transport: str, n: int, interval: float = 1.0) -> list[float]:
    """Webhook sent -> `claimed` logged by a real devpilot-orchestrator process, in ms. `realtime`
    runs against RealtimeRelay with a 120 s poll interval, so polling cannot explain a pickup."""
    relay = RealtimeRelay(db_url) if transport == "realtime" else None
    if relay is not None:
        interval = 120.0
    s = Serve(db_url, relay.env() if relay else None)
    state = Path(tempfile.mkdtemp(prefix="bench-orch-"))
    try:
        oid, token = s.register(user=f"lat-{transport}")
        if relay is not None:
            relay.follow(oid)
        orch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "--url",
                s.url,
                "--token",
                token,
                "--transport",
                transport,
                "--poll-interval",
                str(interval),
                "--state-dir",
                str(state),
                "--json-logs",
                "--",
                "true",
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)
        if relay is not None:
            deadline = time.monotonic() + 20
            while not relay.standin.joins and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)
        sent: dict[str, float] = {}
        with httpx.Client(base_url=s.url) as c:
            for i in range(n):
                event = assignment(f"lat-{i}-{uuid.uuid4().hex[:6]}", f"L-{i}", f"lat-{transport}")
                body = json.dumps(event).encode()
                t0 = time.time()
                r = c.post("/webhook", content=body, headers={"Linear-Signature": sign(SECRET, body)})
                sent[r.json()["messageId"]] = t0
                time.sleep(interval * 0.37 if transport == "poll" else 0.05)
        time.sleep(interval * 1.5 + 0.5 if transport == "poll" else 2.0)
        orch.send_signal(signal.SIGTERM)
        _, err = orch.communicate(timeout=30)
        got: dict[str, float] = {}
        for line in err.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                if rec.get("event") == "claimed" and rec.get("messageId") in sent:
                    got.setdefault(rec["messageId"], rec["ts"])
        return sorted((got[m] - sent[m]) * 1000 for m in got)
    finally:
        s.close()
        shutil.rmtree(state, ignore_errors=True)  # (the orchestrator's state: not needed after)
        if relay is not None:
            relay.close()


def server_cpu_ms(db_url: str, n: int) -> dict[str, float]:
    """The serve process's own CPU per request (ms), over `n` sequential requests of each kind from
    one keep-alive client: an empty /claim, a dispatched /webhook, an ignored /webhook (an issue
    edited, its assignee the same), /healthz. What a serverless platform bills per request is this
    CPU, not the client's wall clock."""
    s = Serve(db_url)
    try:
        return cpu_per_request(s.url, s.proc.pid, s.register()[1], n)
    finally:
        s.close()


def cpu_per_request(url: str, pid: int, token: str, n: int) -> dict[str, float]:
    """CPU of the server process tree `pid` per request (ms) and the median wall time, for each
    kind of request, after 50 warm-up requests (pool filled, statements prepared)."""
    out: dict[str, float] = {}
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=30) as c:

        def signed(event: dict[str, object]) -> httpx.Response:
            body = json.dumps(event).encode()
            return c.post(
                "/webhook",
                content=body,
                headers={"Linear-Signature": sign(SECRET, body), "Linear-Delivery": uuid.uuid4().hex},
            )

        def hook(i: int) -> httpx.Response:
            return signed(assignment(uuid.uuid4().hex, f"C-{i}", "u"))

        def ignored(i: int) -> httpx.Response:
            r = signed(edit(uuid.uuid4().hex, "u"))
            assert r.status_code != 200 or r.json()["status"] == "ignored", r.text
            return r

        kinds: dict[str, Any] = {
            "healthz": lambda i: c.get("/healthz"),
            "empty_claim": lambda i: c.post("/claim", json={"max": 1}, headers=auth),
            "webhook": hook,
            "ignored_webhook": ignored,
        }
        for name, call in kinds.items():
            for i in range(50):
                call(i)
            before = cpu.tree_seconds(pid)
            walls = []
            for i in range(n):
                t0 = time.perf_counter()
                r = call(i)
                walls.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
            out[name] = round((cpu.tree_seconds(pid) - before) / n * 1000, 3)
            out[f"{name}_wall_ms"] = round(sorted(walls)[n // 2] * 1000, 3)
    return out
