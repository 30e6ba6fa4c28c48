"""A load generator in its own process: signed webhooks, or claim+ack cycles, for a duration.

python -m bench.loadgen webhook URL SECRET THREADS SECONDS
python -m bench.loadgen cycle URL TOKEN THREADS SECONDS
Prints one JSON line: {"rate": ..., "count": ..., "p50_ms": ..., "p99_ms": ...}.
"""

from __future__ import annotations

import http.client
import json
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

    def post(
        conn: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        return r.status, r.read()

    # The client is kept lean (the standard library's http.client, one keep-alive connection per
    # thread) so that on a small machine the figure is the server's, not the load generator's.
    def webhook() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        while time.monotonic() < stop:
            body = json.dumps(assignment(uuid.uuid4().hex, "B-1", "u")).encode()
            headers = {"Linear-Signature": sign(secret, body), "Linear-Delivery": uuid.uuid4().hex}
            t0 = time.perf_counter()
            status, answer = post(conn, "/webhook", body, headers)
            dt = time.perf_counter() - t0
            assert status == 200 and json.loads(answer)["status"] == "dispatched", answer
            with lock:
                lat.append(dt)
                count[0] += 1
        conn.close()

    def cycle() -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        auth = {"Authorization": f"Bearer {secret}"}
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            status, answer = post(conn, "/claim", b'{"max": 1}', auth)
            ms = json.loads(answer)["messages"]
            if not ms:
                continue
            m = ms[0]
            ack = json.dumps({"queueId": m["queueId"], "claimToken": m["claimToken"]}).encode()
            status, answer = post(conn, "/ack", ack, auth)
            assert status == 200, answer
            dt = time.perf_counter() - t0
            with lock:
                lat.append(dt)
                count[0] += 1
        conn.close()

    target = webhook if mode == "webhook" else cycle
    ts = [threading.Thread(target=target) for _ in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    lat.sort()
    pick = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000, 2)) if lat else (lambda q: None)
    print(
        json.dumps({"rate": count[0] / elapsed, "count": count[0], "p50_ms": pick(0.5), "p99_ms": pick(0.99)})
    )


if __name__ == "__main__":
    main()
