"""A load generator in its own process: signed webhooks, or claim+ack cycles, for a duration.

python -m bench.loadgen webhook URL SECRET THREADS SECONDS
python -m bench.loadgen cycle URL TOKEN THREADS SECONDS
Prints one JSON line: {"rate": ..., "count": ..., "p50_ms": ..., "p99_ms": ...}.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid

import httpx

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

    def webhook() -> None:
        with httpx.Client(base_url=url, timeout=30) as c:
            while time.monotonic() < stop:
                body = json.dumps(assignment(uuid.uuid4().hex, "B-1", "u")).encode()
                t0 = time.perf_counter()
                r = c.post(
                    "/webhook",
                    content=body,
                    headers={"Linear-Signature": sign(secret, body), "Linear-Delivery": uuid.uuid4().hex},
                )
                dt = time.perf_counter() - t0
                assert r.status_code == 200 and r.json()["status"] == "dispatched", r.text
                with lock:
                    lat.append(dt)
                    count[0] += 1

    def cycle() -> None:
        with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {secret}"}) as c:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                ms = c.post("/claim", json={"max": 1}).json()["messages"]
                if not ms:
                    continue
                m = ms[0]
                r = c.post("/ack", json={"queueId": m["queueId"], "claimToken": m["claimToken"]})
                assert r.status_code == 200
                dt = time.perf_counter() - t0
                with lock:
                    lat.append(dt)
                    count[0] += 1

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
