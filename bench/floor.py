"""How much of a webhook's time is the server's: `devpilot serve` beside a floor server that writes
the same webhooks with the same statement and nothing else.

    python -m bench.floor [ROUNDS] [SECONDS]

The floor is this module's `app`, a bare WSGI application on Granian as `devpilot serve` runs
(one worker, 512 blocking threads). For an issue created with an assignee (the load generator's
`created`) it checks the signature, reads the JSON, and hands the webhook to one of two lane
threads; a lane writes whatever waits, up to 64, through the product's own
`issue_changes_for_delivery` in one statement, and each request answers once its row has
committed. No Flask, no route table, no authorisation, no request log, no classification: what the
product's server does beyond that is the difference. Two more servers split it: `mode` "service"
(`service`) calls the product's own service for each webhook behind the same bare application (so
what it saves against `devpilot serve` is the request's Flask side, and what the floor saves
against it is the intake's Python); "insert" writes each webhook's data as one row of a table of
its own instead of the statement (what the same server does when the statement costs Postgres
almost nothing).

Each round runs, one after the other and in a turning order, the library's one-statement enqueue
(16 clients, a fresh database) and `created` from 16 senders through `devpilot serve` and each of
the three, every server up on its own fresh database the whole time. It
prints each round's rates and, over the rounds, the medians of each ratio and of each server's CPU
a webhook, and writes them to `results/floor.json` (bench/README.md, "Where the time goes").
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from bench.db import BenchServer
from shared.linear.webhooks import signature_ok
from shared.plumbing.sql import query

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

LANES, MOST = 2, 64  # as the intake's group commit (shared/delivery/intake.py)
RESULT = Path(__file__).parent / "results" / "floor.json"
# As `devpilot serve` runs its app: one worker, 512 blocking threads (devpilot/serve.py).
GRANIAN = (
    sys.executable,
    "-m",
    "granian",
    "--interface",
    "wsgi",
    "--workers",
    "1",
    "--blocking-threads",
    "512",
)
INSERT = "INSERT INTO floor_rows (data) SELECT * FROM unnest(%(batch)s::jsonb[]) RETURNING id"

Waiting = tuple[dict[str, Any], "Future[bytes]"]
_line: queue.Queue[Waiting] = queue.Queue()
_started: list[threading.Thread] = []
_start_lock = threading.Lock()


def element(hook: dict[str, Any], delivery: str) -> dict[str, Any]:
    """The statement's element for an issue created with an assignee: what the intake writes for it."""
    data = hook["data"]
    org = hook["organizationId"]
    return {
        "org_id": org,
        "route_user": data["assigneeId"],
        "delivery_key": f"delivery:{delivery}",
        "content_key": "content:"
        + json.dumps([org, hook["type"], hook["action"], data["id"], data["updatedAt"]]),
        "session_id": str(uuid.uuid4()),
        "issue_id": data["id"],
        "issue_identifier": data["identifier"],
        "event_at": data["updatedAt"],
        "payload": {
            "issue": {
                "id": data["id"],
                "identifier": data["identifier"],
                "title": data["title"],
                "url": None,
                "description": None,
            },
            "agentSessionId": None,
            "kind": "start",
            "prompt": None,
            "repository": None,
        },
        "reason": "issue create: assignment changed",
    }


def _answers(conn: psycopg.Connection[DictRow], elements: list[dict[str, Any]]) -> Iterable[bytes]:
    """Each element's answer, in order, once the batch's statement has committed."""
    if os.environ.get("FLOOR_MODE") == "insert":
        rows = conn.execute(INSERT, {"batch": [Jsonb(e) for e in elements]}, prepare=True).fetchall()
        return (json.dumps({"status": "dispatched", "queueId": r["id"]}).encode() for r in rows)
    for n, e in enumerate(elements):
        e["n"] = n
    rows = conn.execute(
        query("issue_changes_for_delivery"), {"batch": Jsonb(elements), "now": None}, prepare=True
    ).fetchall()
    return (
        json.dumps(
            {
                "status": r["outcome"],
                "sessionId": str(r["session_id"]),
                "queueId": str(r["queue_id"]),
                "orchestratorId": str(r["orchestrator_id"]),
            }
        ).encode()
        for r in rows
    )


def _lane() -> None:
    """Writes what waits, up to MOST at a time, in one statement (its own transaction), and answers
    each request after the commit."""
    conn: psycopg.Connection[DictRow] | None = None
    while True:
        batch = [_line.get()]
        while len(batch) < MOST:
            try:
                batch.append(_line.get_nowait())
            except queue.Empty:
                break
        # Anything that goes wrong (no connection, a wrong count of rows) answers the batch's
        # requests with a 500, a bench error, and the lane goes on with a new connection.
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, row_factory=dict_row)
            answers = list(_answers(conn, [e for e, _ in batch]))
            for (_, f), answer in zip(batch, answers, strict=True):
                f.set_result(answer)
        except Exception as exc:
            for _, f in batch:
                if not f.done():
                    f.set_exception(exc)
            if conn is not None:
                conn.close()


def app(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    """The floor: a signed `created` webhook written through the product's statement."""
    if len(_started) < LANES:  # (threads started in the worker, after Granian's fork)
        with _start_lock:
            while len(_started) < LANES:
                _started.append(threading.Thread(target=_lane, daemon=True))
                _started[-1].start()
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    if not signature_ok(os.environ["LINEAR_WEBHOOK_SECRET"], body, environ.get("HTTP_LINEAR_SIGNATURE")):
        return _json(start_response, "401 Unauthorized", b"{}")
    done: Future[bytes] = Future()
    _line.put((element(json.loads(body), environ.get("HTTP_LINEAR_DELIVERY", uuid.uuid4().hex)), done))
    try:
        return _json(start_response, "200 OK", done.result(timeout=30))
    except Exception as exc:
        return _json(start_response, "500 Internal Server Error", json.dumps({"error": repr(exc)}).encode())


def service(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
    """The product's service behind the same bare application: the signature checked and the
    webhook read as `functions/webhook.py` does, then `receive_webhook` (the intake, its group
    commit, the statement); no Flask, no route table, no request log."""
    from functions.runtime import get_runtime
    from shared.dispatch import linear

    rt = get_runtime()
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    if not linear.signed_by_any(rt.settings.webhook_secrets, body, environ.get("HTTP_LINEAR_SIGNATURE")):
        return _json(start_response, "401 Unauthorized", b"{}")
    answer = rt.service.receive_webhook(linear.parse(body), environ.get("HTTP_LINEAR_DELIVERY"))
    return _json(start_response, "200 OK", json.dumps(answer).encode())


def _json(start_response: StartResponse, status: str, body: bytes) -> list[bytes]:
    """A JSON answer with its length, as both bare applications give every answer."""
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class Floor:
    """The floor as a server process on `db_url` (migrated, machine A registered), waited on until
    it answers."""

    def __init__(self, db_url: str, secret: str, mode: str = "statement") -> None:
        from bench import http

        if mode == "insert":
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS floor_rows (id bigserial PRIMARY KEY, data jsonb NOT NULL)"
                )
        self.port = http.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                *GRANIAN,
                "--port",
                str(self.port),
                "bench.floor:service" if mode == "service" else "bench.floor:app",
            ],
            cwd=http.ROOT,
            env={
                **os.environ,
                "DATABASE_URL": db_url,
                "LINEAR_WEBHOOK_SECRET": secret,
                "FLOOR_MODE": mode,
                "DEVPILOT_POOL_MAX": "20",  # (as bench.http.Serve runs devpilot serve)
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not _listening(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("the floor server did not start")
            time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def machine(db_url: str, user: str) -> None:
    """A machine registered for the Linear user `user` of the bench's workspace on `db_url`, as
    `devpilot serve`'s `/orchestrators` registers one: where the floor's webhooks are dispatched."""
    from bench import loadgen
    from bench.core import SETTINGS
    from shared.fleet.orchestrators import register
    from shared.plumbing.db import open_pool

    pool = open_pool(db_url, SETTINGS, min_size=1, max_size=2)
    try:
        register(pool, org_id=loadgen.ORG, linear_user_id=user, name="floor")
    finally:
        pool.close()


def rounds(s: BenchServer, n: int, seconds: float, clients: int = 16) -> dict[str, Any]:
    """`n` rounds of the library's one-statement enqueue and of `created` through `devpilot serve`,
    the bare service, the floor and the insert floor, on fresh databases of `s`; each round's rates,
    and over the rounds the medians of each one's ratio to the library and to the floor, and of each
    server's CPU a webhook (ms). The library gets a fresh database each round; each server keeps its
    own through every round, as `devpilot serve` keeps its in the paired rounds, so its tables grow
    round by round alike."""
    from bench import core, http, loadgen

    servers: dict[str, Floor | http.Serve] = {}
    try:
        product = servers["devpilot serve"] = http.Serve(s.fresh("floorproduct"))
        http.machines(product)
        for side, mode in (("bare service", "service"), ("floor", "statement"), ("insert floor", "insert")):
            db = s.fresh(mode)
            machine(db, loadgen.USER_A)
            servers[side] = Floor(db, http.SECRET, mode)
        for server in servers.values():  # (each server's pool and lanes warm, untimed)
            http.loadgen("webhook", server.url, http.SECRET, clients, 1.0, "created", "warm")
        sides = ["library", *servers]
        out: list[dict[str, float]] = []
        server_ms: dict[str, list[float]] = {side: [] for side in servers}
        for r in range(n):
            rates: dict[str, float] = {}
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                if side == "library":
                    rates[side] = core.enqueue_rate(
                        s.fresh(f"floorlib{r}"), clients, seconds, one_statement=True
                    )
                    continue
                run = partial(
                    http.loadgen,
                    "webhook",
                    servers[side].url,
                    http.SECRET,
                    clients,
                    seconds,
                    "created",
                    f"f{r}",
                )
                answer, cpu = http.cpu_split(run, servers[side].proc.pid)
                rates[side] = answer["rate"]
                if cpu["server"] is not None:  # (a reading that failed is left out, not read as 0)
                    server_ms[side].append(cpu["server"])
            out.append(rates)
            print(f"round {r}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items()), flush=True)
    finally:
        for server in servers.values():  # (each closed whatever another's close raised)
            with contextlib.suppress(Exception):
                server.close()

    return summary(out, server_ms, seconds)


def summary(out: list[dict[str, float]], server_ms: dict[str, list[float]], seconds: float) -> dict[str, Any]:
    """What `rounds` answers, from its rounds' rates (`out`, a dict of rates by side for each round,
    "library" among them) and each server's CPU a webhook in each round: the rounds, the seconds of
    each load, each side's median rate, each server's median of its rounds' ratios to the library
    and to the floor (each round against its own), and each server's median CPU a webhook."""

    def median(side: str, to: str) -> float:
        return round(statistics.median(x[side] / x[to] for x in out), 2)

    return {
        "rounds": out,
        "seconds": seconds,
        "median_rate": {side: round(statistics.median(x[side] for x in out)) for side in out[0]},
        "vs_library": {side: median(side, "library") for side in server_ms},
        "vs_floor": {side: median(side, "floor") for side in server_ms},
        "server_cpu_ms": {
            side: round(statistics.median(v), 3) if v else None for side, v in server_ms.items()
        },
    }


def main(argv: list[str]) -> None:
    s = BenchServer()
    try:
        result = rounds(s, int(argv[0]) if argv else 6, float(argv[1]) if len(argv) > 1 else 3.0)
    finally:
        s.close()
    print("created, medians of the rounds: × the library's one-statement enqueue, server CPU a webhook")
    for side, ratio in result["vs_library"].items():
        cpu = result["server_cpu_ms"][side]
        ms = "?" if cpu is None else f"{cpu:.3f}"
        print(f"  {side:15} {ratio:.2f}×  {ms} ms  ({result['vs_floor'][side]:.2f}× the floor)")
    RESULT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
