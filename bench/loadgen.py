"""A load generator in its own process: signed webhooks, or claim+ack cycles, for a duration.

python -m bench.loadgen webhook URL SECRET THREADS SECONDS
python -m bench.loadgen cycle URL TOKEN THREADS SECONDS
Prints one JSON line: {"rate": ..., "count": ..., "p50_ms": ..., "p99_ms": ..., "cpu_s": ...}.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from urllib.parse import urlsplit

from shared.linear import sign


def assignment(issue_id: str, identifier: str, assignee: str) -> dict[str, object]:
    """A Linear "issue created and assigned" webhook body, as the bench sends it."""
    return {
        "type": "Issue",
        "action": "create",
        "organizationId": "bench",
        "webhookTimestamp": int(time.time() * 1000),
        "data": {
            "id": issue_id,
            "identifier": identifier,
            "title": "bench",
            "assigneeId": assignee,
            "updatedAt": "x",
        },
    }


def edit(issue_id: str, assignee: str) -> dict[str, object]:
    """A Linear "issue updated" webhook body whose assignee did not change (most of the webhooks a
    workspace sends): recorded, and nothing else."""
    body = assignment(issue_id, "B-1", assignee)
    return {**body, "action": "update", "updatedFrom": {"title": "before"}}


class Connection:
    """One keep-alive HTTP/1.1 connection that POSTs and reads answers with a Content-Length (as
    `devpilot serve` gives them; anything else is an error of the bench, raised)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{head}\r\n".encode()
            + body
        )
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._more()
        status_line, *lines = self.buf[:end].decode("latin-1").split("\r\n")
        fields = dict(line.split(":", 1) for line in lines)
        length = next((int(v) for k, v in fields.items() if k.lower() == "content-length"), None)
        if length is None:
            raise RuntimeError(f"an answer without Content-Length: {status_line} {fields}")
        start = end + 4
        while len(self.buf) < start + length:
            self._more()
        answer, self.buf = self.buf[start : start + length], self.buf[start + length :]
        return int(status_line.split(" ", 2)[1]), answer

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def close(self) -> None:
        self.sock.close()


def main() -> None:
    mode, url, secret, threads, seconds = (
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        float(sys.argv[5]),
    )
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    count = [0]

    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 80

    # The client is kept lean so that on a small machine, where it shares the cores with the server
    # and Postgres, the figure is the server's and not the load generator's: one keep-alive
    # connection per thread, each request framed by hand (`Connection`). With http.client it took
    # twice the CPU per webhook (0.46 against 0.23 ms on a 2-core host, body and signature included).
    def webhook() -> None:
        conn = Connection(host, port)
        while time.monotonic() < stop:
            body = json.dumps(assignment(uuid.uuid4().hex, "B-1", "u")).encode()
            headers = {"Linear-Signature": sign(secret, body), "Linear-Delivery": uuid.uuid4().hex}
            t0 = time.perf_counter()
            status, answer = conn.post("/webhook", body, headers)
            dt = time.perf_counter() - t0
            assert status == 200 and json.loads(answer)["status"] == "dispatched", answer
            with lock:
                lat.append(dt)
                count[0] += 1
        conn.close()

    def cycle() -> None:
        conn = Connection(host, port)
        auth = {"Authorization": f"Bearer {secret}"}
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            status, answer = conn.post("/claim", b'{"max": 1}', auth)
            ms = json.loads(answer)["messages"]
            if not ms:
                continue
            m = ms[0]
            ack = json.dumps({"queueId": m["queueId"], "claimToken": m["claimToken"]}).encode()
            status, answer = conn.post("/ack", ack, auth)
            assert status == 200, answer
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                count[0] += 1
        conn.close()

    target = webhook if mode == "webhook" else cycle
    ts = [threading.Thread(target=target) for _ in range(threads)]
    t0, cpu0 = time.monotonic(), time.process_time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed, cpu_s = time.monotonic() - t0, time.process_time() - cpu0
    lat.sort()
    pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2)) if lat else (lambda q: None)
    print(
        json.dumps(
            {
                "rate": count[0] / elapsed,
                "count": count[0],
                "p50_ms": pick(0.5),
                "p99_ms": pick(0.99),
                "cpu_s": cpu_s,  # this process's CPU while it sent (its start-up not included)
            }
        )
    )


if __name__ == "__main__":
    main()
