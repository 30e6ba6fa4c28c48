"""`devpilot serve` (Granian, WSGI on blocking threads) with hundreds of long-polls waiting: webhook intake is not
starved. (How fast it is lives in bench/; this checks that it keeps answering.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from shared.fleet.orchestrators import register
from shared.linear.webhooks import sign
from shared.plumbing.db import Pool
from tests.helpers.api import SECRET, issue_event
from tests.helpers.serving import free_port, start_serve, wait_healthy

ROOT = Path(__file__).parent.parent
LONG_POLLS = 300


def p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99) - 1]


def test_three_hundred_waiting_long_polls_do_not_starve_webhook_intake(pool: Pool, db_url: str) -> None:
    register(pool, org_id="org-a", linear_user_id="user-1", name="target")
    idle = register(pool, org_id="org-a", linear_user_id="user-2", name="long-poller")
    port = free_port()
    server = start_serve(db_url, port)
    url = f"http://127.0.0.1:{port}"
    polls: list[socket.socket] = []
    try:
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=10) as http:

            def webhooks(n: int, tag: str) -> list[float]:
                took = []
                for i in range(n):
                    body = json.dumps(issue_event(issue_id=f"{tag}-{i}")).encode()
                    t0 = time.perf_counter()
                    r = http.post("/webhook", content=body, headers={"Linear-Signature": sign(SECRET, body)})
                    took.append(time.perf_counter() - t0)
                    assert r.json()["status"] == "dispatched"
                return took

            before = webhooks(60, "before")
            body = json.dumps({"waitSeconds": 25}).encode()
            for _ in range(LONG_POLLS):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(
                    b"POST /claim HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Authorization: Bearer {idle.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                polls.append(s)
            time.sleep(2.0)  # all of them waiting now
            during = webhooks(60, "during")
            assert http.get("/healthz").json() == {"ok": True}
        print(
            f"webhook p99 before {p99(before) * 1000:.1f} ms, with {LONG_POLLS} long-polls {p99(during) * 1000:.1f} ms"
        )
        assert p99(during) < max(5 * p99(before), 0.25)
        for s in polls[:5]:  # and the long-polls are still being held, not refused or closed
            s.settimeout(0.2)
            with pytest.raises(TimeoutError):
                s.recv(1)
    finally:
        for s in polls:
            s.close()
        server.terminate()
        server.wait(timeout=20)


def test_clients_trickling_their_headers_do_not_hold_the_server(pool: Pool, db_url: str) -> None:
    """150 clients each sending their request a byte at a time: /healthz still answers within a
    second or two, and the server cuts every one of them off at its header deadline."""
    from devpilot.serve import HEADER_DEADLINE

    port = free_port()
    server = start_serve(db_url, port)
    url = f"http://127.0.0.1:{port}"
    slow: list[socket.socket] = []
    try:
        wait_healthy(url)
        for _ in range(150):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /claim HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)
        started = time.monotonic()
        closed: set[int] = set()

        def trickle() -> None:
            while len(closed) < len(slow) and time.monotonic() - started < HEADER_DEADLINE + 20:
                for i, s in enumerate(slow):
                    if i in closed:
                        continue
                    try:
                        s.sendall(b"X")
                    except OSError:
                        closed.add(i)
                time.sleep(0.5)

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        time.sleep(3.0)  # every one of them is in its headers now
        t0 = time.monotonic()
        assert httpx.get(url + "/healthz", timeout=5).json() == {"ok": True}
        assert time.monotonic() - t0 < 2
        t.join(timeout=HEADER_DEADLINE + 25)
        assert len(closed) == len(slow), f"{len(slow) - len(closed)} trickling clients still held"
        assert time.monotonic() - started < HEADER_DEADLINE + 15
    finally:
        for s in slow:
            s.close()
        server.terminate()
        server.wait(timeout=20)
