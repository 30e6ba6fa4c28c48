"""`devpilot serve` as a real process, the way users run it, for tests that kill it, restart it or
run two of it: started on a free port against a test database, waited on until it answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers import bouncer
from tests.helpers.api import ADMIN, SECRET

ROOT = Path(__file__).parent.parent.parent


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports. Each socket stays bound until all are picked: closed one by one, the
    kernel may hand the same port out twice (seen: two route targets on one port, the second dying
    on bind while the first answered for both)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def start_serve(
    db_url: str,
    port: int,
    extra_env: dict[str, str] | None = None,
    *,
    stderr: int | None = subprocess.DEVNULL,
    sweep_every: float = 0,
    root: Path = ROOT,
) -> subprocess.Popen[str]:
    """Started, not waited on (a test that kills it restarts it at once). No in-process sweep
    unless `sweep_every` says how often. `root`: the code it runs (another release's checkout)."""
    return subprocess.Popen(
        [sys.executable, "-m", "devpilot", "serve", "--port", str(port), "--sweep-every", str(sweep_every)],
        cwd=root,
        env={
            **os.environ,
            "PYTHONPATH": str(root),
            **bouncer.app_env(db_url),
            "DEVPILOT_ADMIN_TOKEN": ADMIN,
            "LINEAR_WEBHOOK_SECRET": SECRET,
            **(extra_env or {}),
        },
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )


def wait_healthy(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url.rstrip("/") + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not become healthy")


def raw_exchange(
    url: str, head: str, body: bytes, *, pieces: int = 300_000, pause: float = 0.0, end_early: bool = False
) -> tuple[int, bytes]:
    """One request written byte for byte (what httpx will not send: a body shorter than its
    Content-Length, a body in pieces with pauses), `Connection: close`, and the answer read to the
    end: its status and its body. `head` is the request line and headers without the blank line;
    with `end_early` the client stops sending (half-closes) after the body it has."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"{head}\r\nConnection: close\r\n\r\n".encode())
        for start in range(0, len(body), pieces):
            if start and pause:
                time.sleep(pause)
            s.sendall(body[start : start + pieces])
        if end_early:
            s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status, _, payload = answer.partition(b"\r\n\r\n")
    return int(status.split()[1]), payload
