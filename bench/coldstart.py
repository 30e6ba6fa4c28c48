"""Cold start: spawn of one functions-framework target to its first real answer.

What a scale-from-zero request waits for on Cloud Run or Lambda, less the platform's own part: the
interpreter, the target's imports (each target imports only its module and what that needs), the
first database connection, and the request itself. Measured for the routes an idle fleet and
Linear call (`claim`, `ack`, `webhook`) and for `healthz`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import assignment
from shared.linear import sign

ROOT = Path(__file__).resolve().parent.parent
ADMIN, SECRET = "bench-admin", "bench-secret"
FRAMEWORK = [sys.executable, "-m", "functions_framework", "--source", "functions/main.py"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(target: str, url: str, token: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"}
    if target == "claim":
        return httpx.post(url, json={"max": 1}, headers=auth, timeout=5)
    if target == "ack":
        return httpx.post(
            url, json={"queueId": str(uuid.uuid4()), "claimToken": str(uuid.uuid4())}, headers=auth
        )
    if target == "webhook":
        body = json.dumps(assignment(uuid.uuid4().hex, "CS-1", "cold")).encode()
        return httpx.post(url, content=body, headers={"Linear-Signature": sign(SECRET, body)}, timeout=5)
    return httpx.get(url, timeout=5)


def cold_start_ms(db_url: str, target: str, token: str) -> tuple[float, int]:
    """Spawn -> first answer that is not a connection error, in ms, and the number of modules the
    target imported by then (from the process's own report at exit)."""
    port = _port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_url,
        "DEVPILOT_ADMIN_TOKEN": ADMIN,
        "LINEAR_WEBHOOK_SECRET": SECRET,
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [*FRAMEWORK, "--target", target, "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            try:
                r = _request(target, url, token)
                break
            except httpx.TransportError:
                if time.perf_counter() - t0 > 30:
                    raise RuntimeError(f"{target} did not answer within 30 s") from None
                time.sleep(0.005)
        elapsed = (time.perf_counter() - t0) * 1000
        assert r.status_code < 500, (target, r.status_code, r.text)
        return elapsed, _modules(target, env)
    finally:
        proc.kill()
        proc.wait()


def _modules(target: str, env: dict[str, str]) -> int:
    """How many modules importing the target loads (functions_framework's own included)."""
    code = (
        "import sys, functions_framework, importlib.util; "
        "spec = importlib.util.spec_from_file_location('main', 'functions/main.py'); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
        f"getattr(m, {target!r}); print(len(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def cold_starts(db_url: str, token: str, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target in ("claim", "ack", "webhook", "healthz"):
        runs = [cold_start_ms(db_url, target, token) for _ in range(repeats)]
        times = sorted(ms for ms, _ in runs)
        out[target] = {
            "median_ms": round(times[len(times) // 2]),
            "max_ms": round(times[-1]),
            "modules": runs[0][1],
        }
    return out
