"""Cold start: spawn of one functions-framework target to its first real answer.

What a scale-from-zero request waits for on Cloud Run or Lambda, less the platform's own part: the
interpreter, the target's imports (each target imports only its module and what that needs), the
first database connection, and the request itself. Measured for the routes an idle fleet and
Linear call (`claim`, `ack`, `webhook`) and for `healthz`.

With this project's bytecode compiled beforehand (in its `__pycache__` folders, which git ignores),
as the Lambda zip ships it (`infra/aws_lambda.py`): whatever the environment says of writing
bytecode (`PYTHONDONTWRITEBYTECODE` is set on some hosts), no timed spawn compiles a module of ours
from source. The libraries' bytecode is pip's, written when they were installed.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import assignment
from shared.linear.webhooks import sign

ROOT = Path(__file__).resolve().parent.parent
ADMIN, SECRET = "bench-admin", "bench-secret"
FRAMEWORK = [sys.executable, "-m", "functions_framework", "--source", "functions/main.py"]
# The framework's floor (bench/cold_floor.py): the framework serving a first request that opens one
# connection and runs one statement, with nothing of this project's.
FLOOR = [sys.executable, "-m", "functions_framework", "--source", "bench/cold_floor.py"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _first_request(target: str, token: str) -> tuple[str, bytes, dict[str, str]]:
    """The target's first request: method, body, headers."""
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if target == "claim":
        return "POST", json.dumps({"max": 1}).encode(), auth
    if target == "ack":
        ack = {"queueId": str(uuid.uuid4()), "claimToken": str(uuid.uuid4())}
        return "POST", json.dumps(ack).encode(), auth
    if target == "webhook":
        body = json.dumps(assignment(uuid.uuid4().hex, "CS-1", "cold")).encode()
        return "POST", body, {"Linear-Signature": sign(SECRET, body), "Content-Type": "application/json"}
    return "GET", b"", {}


def _request(client: httpx.Client, target: str, url: str, token: str) -> httpx.Response:
    method, body, headers = _first_request(target, token)
    return client.request(method, url, content=body or None, headers=headers)


def _client() -> httpx.Client:
    """The client that waits for the answer, made (and its first refused connection tried) before
    the spawn: `httpx.request` builds a client with its SSL context at every call, about 30 ms of
    this process's CPU each (140 ms the first), which made every try of the loop that long and
    added up to 50 ms to the figure (before 2026-12-06, afternoon)."""
    client = httpx.Client(timeout=5)
    with contextlib.suppress(httpx.TransportError):
        client.get(f"http://127.0.0.1:{_port()}/")
    return client


def cold_start_ms(db_url: str, target: str, token: str) -> tuple[float, int]:
    """Spawn -> first answer that is not a connection error, in ms, and the number of modules the
    target holds once it has answered (`_modules`: the same first request, in a process of its own)."""
    env = _env(db_url)
    return _spawn_to_answer(FRAMEWORK, env, target, token), _modules(target, env, token)


def _env(db_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_url,
        "DEVPILOT_ADMIN_TOKEN": ADMIN,
        "LINEAR_WEBHOOK_SECRET": SECRET,
    }


def _spawn_to_answer(framework: list[str], env: dict[str, str], target: str, token: str) -> float:
    """Spawn of `framework --target target` -> its first answer that is not a connection error, in ms."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    client = _client()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*framework, "--target", target, "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while True:
            try:
                r = _request(client, target, url, token)
                break
            except httpx.TransportError:
                if time.perf_counter() - t0 > 30:
                    raise RuntimeError(f"{target} did not answer within 30 s") from None
                time.sleep(0.005)
        elapsed = (time.perf_counter() - t0) * 1000
        assert r.status_code < 500, (target, r.status_code, r.text)
        return elapsed
    finally:
        # The whole group: killed alone, gunicorn's master left its worker running until the worker's
        # next look at its parent (up to a second), and that worker then shut down (its pool, its
        # threads, the interpreter's finalisation) inside whatever spawn was timed next.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        client.close()


# Run by `_modules` in a process of its own: the target as functions-framework loads it, its first
# request handed straight to its WSGI app, then how many modules the process holds. A view's
# module, and what a view imports on first use, are loaded only by that first request, so counting
# before it would leave them out. (functions-framework has imported werkzeug.test already.)
_COUNT_AFTER_FIRST_ANSWER = """
import json, sys
import functions_framework
from werkzeug.test import EnvironBuilder
method, body, headers = json.loads(sys.argv[2])
app = functions_framework.create_app(sys.argv[1], "functions/main.py")
environ = EnvironBuilder(method=method, data=body.encode("latin-1"), headers=headers).get_environ()
status = []
b"".join(app(environ, lambda s, h, e=None: status.append(s)))
assert int(status[0][:3]) < 500, status
print(len(sys.modules))
"""


def _modules(target: str, env: dict[str, str], token: str) -> int:
    """How many modules the target holds once it has answered its first request
    (functions-framework's own included)."""
    method, body, headers = _first_request(target, token)
    request = json.dumps([method, body.decode("latin-1"), headers])
    out = subprocess.run(
        [sys.executable, "-c", _COUNT_AFTER_FIRST_ANSWER, target, request],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip())


# What every target needs before it can answer: the baseline of the cold-start target (each
# target's figure within 1.25x of it), spawned the same way, on the same interpreter, in the same run.
BARE_IMPORT = "import functions_framework, psycopg, psycopg_pool"


def bare_import_ms() -> float:
    """Spawn of an interpreter that imports only what every target needs -> its word that it has,
    in ms (not its exit: a target's first answer comes before any interpreter shutdown too)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", f"{BARE_IMPORT}; print('ok', flush=True)"], cwd=ROOT, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    word = proc.stdout.readline()
    elapsed = (time.perf_counter() - t0) * 1000
    proc.wait()
    proc.stdout.close()
    assert word == b"ok\n", word
    return elapsed


def floor_ms(db_url: str) -> float:
    """Spawn of the framework's floor (`FLOOR`) -> its first answer, in ms."""
    return _spawn_to_answer(FLOOR, _env(db_url), "floor", "")


def cold_starts(db_url: str, token: str, repeats: int) -> dict[str, Any]:
    """Each target's cold start, the bare import spawned just before each of its spawns (the host
    drifts: a baseline taken minutes apart would move the ratio) and the framework's floor just
    after it."""
    out: dict[str, Any] = {}
    for package in ("functions", "shared"):
        compileall.compile_dir(ROOT / package, quiet=1)
    bare: list[float] = []
    floor: list[float] = []
    for target in ("claim", "ack", "webhook", "healthz"):
        runs = []
        for _ in range(repeats):
            bare.append(bare_import_ms())
            runs.append(cold_start_ms(db_url, target, token))
            floor.append(floor_ms(db_url))
        times = sorted(ms for ms, _ in runs)
        out[target] = {
            "median_ms": round(times[len(times) // 2]),
            "max_ms": round(times[-1]),
            "modules": runs[0][1],
        }
    for name, times in (("bare_import", bare), ("framework_floor", floor)):
        times.sort()
        out[name] = {"median_ms": round(times[len(times) // 2]), "max_ms": round(times[-1]), "n": len(times)}
    out["framework_floor"]["vs_bare_import"] = round(
        out["framework_floor"]["median_ms"] / out["bare_import"]["median_ms"], 2
    )
    for target in ("claim", "ack", "webhook", "healthz"):
        out[target]["vs_bare_import"] = round(out[target]["median_ms"] / out["bare_import"]["median_ms"], 2)
        out[target]["vs_framework_floor"] = round(
            out[target]["median_ms"] / out["framework_floor"]["median_ms"], 2
        )
    return out
