"""`devpilot serve` as a real process: startup, embedded database, clean stop, database faults."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg
import pytest

from tests.helpers.api import ADMIN, SECRET, Api, issue_event
from tests.helpers.mid_call import run_script

ROOT = Path(__file__).parent.parent


def spawn_serve(env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """`devpilot serve` on a free port, its output piped, not waited on."""
    return subprocess.Popen(
        [sys.executable, "-m", "devpilot", "serve", "--port", "0", "--sweep-every", "1"],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_serve(env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], str, list[str]]:
    proc = spawn_serve(env, cwd)
    assert proc.stdout is not None
    lines: list[str] = []
    url = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.strip())
        if line.startswith("devpilot serving on "):
            url = line.split()[-1]
        if line.startswith("sweep:"):
            break
    assert url, f"serve did not start: {lines} {proc.stderr.read() if proc.stderr else ''}"
    return proc, url, lines


def drain(stream: IO[str] | None, into: list[str]) -> threading.Thread:
    def run() -> None:
        if stream is not None:
            for line in stream:
                into.append(line)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    proc, url, lines = start_serve(
        {"DATABASE_URL": db_url, "DEVPILOT_ADMIN_TOKEN": ADMIN, "LINEAR_WEBHOOK_SECRET": SECRET}, tmp_path
    )
    yield proc, url, lines
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_serve_prints_url_and_database_and_stops_on_sigterm(
    served: tuple[subprocess.Popen[str], str, list[str]],
) -> None:
    proc, url, lines = served
    assert any(line.startswith("database: ") and "dbname=devpilot_t_" in line for line in lines)
    assert httpx.get(url + "/healthz").json() == {"ok": True}
    err: list[str] = []
    drain(proc.stderr, err)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    assert proc.stdout is not None
    assert proc.stdout.read().count("devpilot stopped") == 1  # the master says it, not the worker too
    logged = [line for line in err if line.startswith("{")]
    assert any('"route":"healthz"' in line and '"status":200' in line for line in logged)


def test_serve_says_at_start_which_settings_are_missing(db_url: str, tmp_path: Path) -> None:
    proc, _, lines = start_serve({"DATABASE_URL": db_url, "LINEAR_WEBHOOK_SECRET": SECRET}, tmp_path)
    try:
        said = "\n".join(lines)
        assert "admin token (DEVPILOT_ADMIN_TOKEN): NOT SET" in said
        assert "webhook secret (LINEAR_WEBHOOK_SECRET): set" in said
        assert "encryption keys (DEVPILOT_ENCRYPTION_KEYS): NOT SET" in said
        assert SECRET not in said
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_second_serve_on_a_port_in_use_stops_at_start_and_names_it(
    db_url: str, tmp_path: Path, workers: int
) -> None:
    """The README's walkthrough pasted while `./dev serve` still runs: the second serve (another
    admin token) must not share the port with the first (on Linux Granian's workers bound it with
    SO_REUSEPORT, and every other request reached the other serve: 200 200 401 200 401 ...)."""
    env = {"DATABASE_URL": db_url, "DEVPILOT_ADMIN_TOKEN": ADMIN, "DEVPILOT_SERVE_WORKERS": str(workers)}
    first, url, _ = start_serve(env, tmp_path)
    try:
        port = url.rsplit(":", 1)[1]
        second = subprocess.run(
            [sys.executable, "-m", "devpilot", "serve", "--port", port],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env, "DEVPILOT_ADMIN_TOKEN": "another-admin-token"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode != 0, second.stdout
        assert f"port {port} on 127.0.0.1 is in use" in second.stderr
        assert "serving on" not in second.stdout
        # Every request still reaches the first serve, and each of its workers answers.
        answers = {
            httpx.get(url + "/orchestrators", headers={"Authorization": f"Bearer {ADMIN}"}).status_code
            for _ in range(40)
        }
        assert answers == {200}
    finally:
        first.kill()
        first.wait()


def test_serve_answers_as_soon_as_it_says_it_serves(db_url: str, tmp_path: Path) -> None:
    """Whoever reads "devpilot serving on URL" may call at once: the line comes after the worker
    listens, not before (Granian's worker binds its socket after the app is built; a connect right
    after the line was refused every time before this was fixed)."""
    for _ in range(3):
        proc = spawn_serve({"DATABASE_URL": db_url, "DEVPILOT_ADMIN_TOKEN": ADMIN}, tmp_path)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.startswith("devpilot serving on "), first
            url = first.split()[-1]
            host, port = url.removeprefix("http://").rsplit(":", 1)
            # At once and once: a plain connect (an HTTP client's own set-up time would hide it).
            socket.create_connection((host, int(port)), timeout=5).close()
            r = httpx.get(url + "/healthz", timeout=5)
            assert r.status_code == 200 and r.json() == {"ok": True}
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def test_serve_without_database_url_uses_embedded_postgres(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TEST_DATABASE_URL")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "devpilot", "serve", "--port", "0"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT), "DEVPILOT_ADMIN_TOKEN": ADMIN},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(3)]
        url = lines[0].split()[-1]
        assert "embedded Postgres" in lines[1]
        assert (tmp_path / ".devpilot" / "pgdata").is_dir()
        r = httpx.post(
            url + "/orchestrators",
            json={"orgId": "o", "linearUserId": "u", "name": "n"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert r.status_code == 201
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_devpilot_without_xdg_runtime_dir_prints_no_warning(tmp_path: Path) -> None:
    """root, a container, SSH: no XDG_RUNTIME_DIR. The embedded Postgres's runtime directory falls
    back quietly; every `devpilot` command used to print a RuntimeDirWarning and its source line."""
    unset = ("DATABASE_URL", "TEST_DATABASE_URL", "XDG_RUNTIME_DIR")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    for command in (["migrate"], ["status", "--json"]):
        r = subprocess.run(
            [sys.executable, "-m", "devpilot", *command],
            cwd=tmp_path,
            env={**env, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert "Warning" not in r.stderr and "XDG_RUNTIME_DIR" not in r.stderr, r.stderr


def test_terminated_connections_give_503_then_recover(api: Api, db_url: str) -> None:
    _, token = api.register()
    results: list[tuple[int, dict[str, object]]] = []
    answered_at: list[tuple[float, int]] = []
    stop = threading.Event()

    def sender(n: int) -> None:
        i = 0
        with httpx.Client(base_url=api.url, timeout=30) as c:
            while not stop.is_set():
                i += 1
                event = issue_event(issue_id=f"s{n}-{i}")
                import json

                from shared.linear.webhooks import sign

                body = json.dumps(event).encode()
                r = c.post(
                    "/webhook",
                    content=body,
                    headers={"Linear-Signature": sign(SECRET, body), "Linear-Delivery": f"s{n}-{i}"},
                )
                results.append((r.status_code, r.json()))
                answered_at.append((time.monotonic(), r.status_code))

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with psycopg.connect(db_url, autocommit=True) as killer:
        for _ in range(5):
            killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            time.sleep(0.2)
    last_kill = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    codes = {code for code, _ in results}
    print("status codes seen:", {c: sum(1 for x, _ in results if x == c) for c in codes})
    assert codes <= {200, 503}, codes
    assert 500 not in codes
    # The pool recovered while the senders were still sending: 200s after the last termination.
    assert any(t > last_kill and code == 200 for t, code in answered_at)
    assert api.http.get("/healthz").json() == {"ok": True}
    dispatched = {b["queueId"] for code, b in results if code == 200}
    claimed: set[str] = set()
    while True:
        ms = api.post_as(token, "/claim", {"max": 100}).json()["messages"]
        if not ms:
            break
        claimed |= {m["queueId"] for m in ms}
    assert claimed == dispatched  # every 200 is claimable; a 503 left nothing behind
    with api.pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS n FROM dispatch_sessions").fetchone()
    assert row is not None and row["n"] == len(dispatched)


def test_healthz_is_503_when_the_database_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from werkzeug.serving import make_server

    from devpilot.serve import QuietHandler
    from functions import runtime
    from functions.app import wsgi
    from shared.plumbing.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none?connect_timeout=1")
    monkeypatch.setenv("DEVPILOT_DB_CONNECT_TIMEOUT_SECONDS", "1")
    get_settings.cache_clear()
    runtime.install(None)
    server = make_server("127.0.0.1", 0, wsgi, threaded=True, request_handler=QuietHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        r = httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=30)
        assert r.status_code == 503
        assert r.json()["error"] == "db_unavailable" and r.headers["Retry-After"]
    finally:
        server.shutdown()
        runtime.install(None)
        get_settings.cache_clear()


def _cpu_ticks(pid: str) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_two_workers_share_the_work_count_metrics_together_and_sweep_once(
    db_url: str, tmp_path: Path
) -> None:
    """DEVPILOT_SERVE_WORKERS=2: two worker processes answer requests (each connection goes to one
    of them); a long-poll held by either is woken by a webhook the other took; /metrics counts
    every worker's requests whichever worker answers the scrape; only one worker runs the sweep;
    SIGTERM stops both and leaves no metrics files behind."""
    from shared.linear.webhooks import sign
    from tests.helpers.api import issue_event

    metrics_dirs = set(Path(tempfile.gettempdir()).glob("devpilot-metrics-*"))
    spawned = time.monotonic()
    proc, url, lines = start_serve(
        {
            "DATABASE_URL": db_url,
            "DEVPILOT_ADMIN_TOKEN": ADMIN,
            "LINEAR_WEBHOOK_SECRET": SECRET,
            "DEVPILOT_SERVE_WORKERS": "2",
            "DEVPILOT_METRICS": "1",
        },
        tmp_path,
    )
    err: list[str] = []
    drain(proc.stderr, err)
    close = {"Connection": "close"}  # every request on a new connection: the kernel picks a worker
    try:
        assert "workers: 2" in lines and sum(line.startswith("devpilot serving on") for line in lines) == 1
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(workers) == 2
        r = httpx.post(
            url + "/orchestrators",
            json={"orgId": "org-a", "linearUserId": "user-1", "name": "laptop"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        token = r.json()["token"]
        auth = {"Authorization": f"Bearer {token}", **close}

        # Both workers answer: empty polls until each worker has spent CPU on its share (counted
        # once both have settled after starting).
        for _ in range(20):
            httpx.get(url + "/healthz", headers=close)
        time.sleep(1)
        before = {w: _cpu_ticks(w) for w in workers}
        polls = 0
        while polls < 100 or (polls < 2000 and min(_cpu_ticks(w) - before[w] for w in workers) < 3):
            assert httpx.post(url + "/claim", json={}, headers=auth).json() == {"messages": []}
            polls += 1
        assert min(_cpu_ticks(w) - before[w] for w in workers) >= 3, "one worker answered nothing"

        # Long-polls woken by webhooks, whichever worker holds the poll and whichever takes the hook.
        for i in range(4):
            got: list[dict[str, Any]] = []
            waiting = threading.Thread(
                target=lambda into=got: into.append(
                    httpx.post(url + "/claim", json={"waitSeconds": 20}, headers=auth, timeout=30).json()
                )
            )
            started = time.monotonic()
            waiting.start()
            time.sleep(0.3)
            body = json.dumps(issue_event(issue_id=f"issue-{i}")).encode()
            hook = httpx.post(
                url + "/webhook",
                content=body,
                headers={"Linear-Signature": sign(SECRET, body), "Linear-Delivery": f"d-{i}", **close},
            )
            assert hook.status_code == 200, hook.text
            waiting.join(timeout=30)
            assert time.monotonic() - started < 10, "the long-poll was not woken"
            (message,) = got[0]["messages"]
            assert message["issue"]["id"] == f"issue-{i}"
            ack = httpx.post(
                url + "/ack",
                json={"queueId": message["queueId"], "claimToken": message["claimToken"]},
                headers=auth,
            )
            assert ack.status_code == 200, ack.text
        polls += 4

        # Every scrape, whichever worker answers it, counts every worker's claims.
        for _ in range(6):
            assert _metric(url, "devpilot_claim_seconds_count") == polls
            assert _metric(url, "devpilot_acked_messages_total") == 4

        # One sweep a second, not one per worker.
        time.sleep(max(0.0, 8 - (time.monotonic() - spawned)))
        swept = _metric(url, "devpilot_sweep_seconds_count")
        assert 1 <= swept <= time.monotonic() - spawned + 1

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert proc.stdout is not None and proc.stdout.read().count("devpilot stopped") == 1
        assert set(Path(tempfile.gettempdir()).glob("devpilot-metrics-*")) == metrics_dirs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("workers", [1, 2])
def test_the_worker_does_not_outlive_a_sigkilled_serve(db_url: str, tmp_path: Path, workers: int) -> None:
    """A SIGKILLed `devpilot serve` leaves no worker behind holding its port and its connections:
    each worker notices its master is gone and exits, and the port can be served again. Several
    workers' shared metrics directory goes with them."""
    from tests.helpers.serving import start_serve as start_on
    from tests.helpers.serving import wait_healthy

    metrics_dirs = set(Path(tempfile.gettempdir()).glob("devpilot-metrics-*"))
    proc, url, _ = start_serve(
        {
            "DATABASE_URL": db_url,
            "DEVPILOT_ADMIN_TOKEN": ADMIN,
            "LINEAR_WEBHOOK_SECRET": SECRET,
            "DEVPILOT_SERVE_WORKERS": str(workers),
        },
        tmp_path,
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == workers, "serve runs each worker in a process of its own"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(Path(f"/proc/{c}").exists() for c in children):
        time.sleep(0.1)
    alive = [c for c in children if Path(f"/proc/{c}").exists() and "zombie" not in _state(c)]
    assert alive == [], f"worker(s) {alive} outlived their master"
    assert set(Path(tempfile.gettempdir()).glob("devpilot-metrics-*")) == metrics_dirs
    port = int(url.rsplit(":", 1)[1])
    again = start_on(db_url, port)
    try:
        wait_healthy(url, timeout=30)
    finally:
        again.kill()
        again.wait()


# A worker forked by a master that is SIGKILLed before the worker's app factory runs: the
# "master" forks the worker and dies at once; the worker, already orphaned, then starts its app.
_ORPHANED_BEFORE_START = """
import os, sys, time
from devpilot import serve
serve._worker.update(start=lambda: None, stop=lambda: None, orphaned=lambda: None)
serve._master["pid"] = os.getpid()
worker = os.fork()
if worker:
    print(worker, flush=True)
    os._exit(0)  # (as SIGKILL leaves it: nothing of the master runs on)
quiet = os.open(os.devnull, os.O_WRONLY)  # (the test reads the master's output to its end)
os.dup2(quiet, 1)
os.dup2(quiet, 2)
while os.getppid() == serve._master["pid"]:
    time.sleep(0.01)
serve.worker_app()
time.sleep(60)
"""


def test_a_worker_whose_master_died_before_it_started_leaves_too() -> None:
    """A master SIGKILLed in the instant between forking a worker and the worker starting its app
    (on a loaded host, a wide one): the worker, already another process's child, must still see
    that its master is gone and leave, not take its new parent for its master and stay for ever."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", _ORPHANED_BEFORE_START],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    worker = out.stdout.strip()
    assert worker.isdigit(), out.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "zombie" not in _state(worker):
        time.sleep(0.05)
    left = "zombie" in _state(worker)
    if not left:
        os.kill(int(worker), signal.SIGKILL)
    assert left, "the worker outlived its master"


def _state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def test_serve_stops_on_signals_in_quick_succession(db_url: str, tmp_path: Path) -> None:
    """SIGTERM twice and SIGINT at once (a shell's job control, an impatient operator): serve still
    stops within its grace period plus ten seconds. Signals sent together often land on a thread
    other than the master's main one; the master must wake for them all the same."""
    for _ in range(3):
        proc, url, _ = start_serve(
            {"DATABASE_URL": db_url, "DEVPILOT_ADMIN_TOKEN": ADMIN, "LINEAR_WEBHOOK_SECRET": SECRET}, tmp_path
        )
        assert httpx.get(url + "/healthz").status_code == 200
        for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGINT):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# Runs in a child process: plays the master's first SIGTERM handler and makes a second SIGTERM land
# while that handler is inside the main-loop wake-up's set() (the trace sends it at set()'s second
# line, once a lock-based event holds its lock). Prints "woke" when both handlers ran to the end.
_SECOND_SIGNAL_MID_WAKEUP = """
import os, signal, sys
from granian._signals import set_main_signals
from granian.constants import Interfaces
from devpilot.master import SignalSafeServer
from tests.helpers.mid_call import done, signal_inside

server = SignalSafeServer("devpilot.serve:worker_app", interface=Interfaces.WSGI)
set_main_signals(server.signal_handler_interrupt, server.signal_handler_reload)
wake = server.main_loop_interrupt
lines = signal_inside(wake, "set", signal.SIGTERM)
server.signal_handler_interrupt()
done()
assert len(lines) >= 2, lines
print("woke", wake.wait(0), server.interrupt_signal, flush=True)
"""


def test_a_second_signal_while_the_master_wakes_does_not_hang_it() -> None:
    """The moment that hung Granian's own master (its SIGTERM handler re-entered while holding its
    event's lock), made to happen on purpose: the master's wake-up survives it and is set."""
    hung = "the master hung when a second signal arrived while it was waking up"
    assert run_script(_SECOND_SIGNAL_MID_WAKEUP, hung=hung) == ["woke", "True", "True"]
