"""Crashes, faults and races: nothing lost, nothing twice, the invariant at every commit."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest

from shared.delivery.queue import claim, release, revoke, sweep
from shared.fleet.orchestrators import register
from shared.plumbing.db import Pool
from shared.plumbing.settings import Settings
from tests.helpers.api import SECRET, Api, issue_event
from tests.helpers.data import MakeOrch, enqueue_one, row_counts
from tests.helpers.serving import free_port, start_serve

ROOT = Path(__file__).parent.parent
INVARIANT = """
SELECT
  (SELECT count(*) FROM dispatch_sessions s
    WHERE (s.status = 'queued') <> EXISTS (SELECT 1 FROM dispatch_queue q WHERE q.session_id = s.id)) AS broken,
  (SELECT count(*) FROM dispatch_queue q
    WHERE NOT EXISTS (SELECT 1 FROM dispatch_sessions s WHERE s.id = q.session_id)) AS orphans
"""


def assert_invariant(pool: Pool) -> None:
    with pool.connection() as conn:
        row = conn.execute(INVARIANT).fetchone()
    assert row is not None and (row["broken"], row["orphans"]) == (0, 0)


def snapshot(pool: Pool) -> dict[str, int]:
    c = row_counts(pool)
    return {"s": c["sessions"], "q": c["queue"], "d": c["deliveries"]}


def test_killed_after_each_statement_of_the_intake_transaction(pool: Pool, db_url: str) -> None:
    """Every kill point between the intake's statements: all of it committed, or none of it."""
    reg = register(pool, org_id="org-a", linear_user_id="user-1", name="m")
    # first, one old dispatch of the issue for the re-assignment to cancel
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.helpers.intake_kill",
            db_url,
            "seed",
            "999",
            json.dumps(issue_event(assignee="user-1")),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    register(pool, org_id="org-a", linear_user_id="user-2", name="n")
    event = json.dumps(issue_event("update", assignee="user-2", updated_from={"assigneeId": "user-1"}))
    outcomes = set()
    whole: dict[str, int] = {}
    k = 0
    while True:
        k += 1
        before = snapshot(pool)
        whole = {"s": before["s"] + 1, "q": before["q"], "d": before["d"] + 1}
        r = subprocess.run(
            [sys.executable, "-m", "tests.helpers.intake_kill", db_url, f"key-{k}", str(k), event],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        after = snapshot(pool)
        assert_invariant(pool)
        if r.returncode == -signal.SIGKILL:
            assert after in (before, whole), f"kill after statement {k} left a partial write"
            if after == before:
                outcomes.add("nothing")
                continue
            # Committed whole, the answer lost: Linear's retry of the delivery finds it.
            outcomes.add("everything, unanswered")
            retry = subprocess.run(
                [sys.executable, "-m", "tests.helpers.intake_kill", db_url, f"key-{k}", "999", event],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            assert json.loads(retry.stdout)["answer"]["status"] == "duplicate"
            assert snapshot(pool) == whole
            break
        assert r.returncode == 0, r.stderr
        done = json.loads(r.stdout)
        assert done["answer"]["status"] == "dispatched" and done["answer"]["cancelledSessionId"]
        assert after == whole
        outcomes.add("everything")
        break
    # One statement, the re-assignment's (`issue_changes_for_delivery`, its own transaction: the
    # delivery with the issue's turn, the cancel, the enqueue): a kill right after it finds it
    # committed whole, and the retry answers `duplicate`.
    assert k == 1 and outcomes == {"everything, unanswered"}
    del reg


def test_serve_sigkilled_repeatedly_under_retrying_senders(pool: Pool, db_url: str) -> None:
    """Linear-like senders retry one delivery id until they get a 200 while `serve` is SIGKILLed at
    random moments: afterwards one session per delivery, the invariant holds, all work claimable once."""
    from shared.linear.webhooks import sign

    orch = register(pool, org_id="org-a", linear_user_id="user-1", name="m")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = [start_serve(db_url, port)]
    heavy = os.environ.get("DEVPILOT_HEAVY") == "1"
    deliveries = 1200 if heavy else 240
    senders = 16 if heavy else 8
    results: dict[str, dict[str, Any]] = {}
    retries = [0]
    kills = [0]
    lock = threading.Lock()
    done = threading.Event()

    killed_all = threading.Event()

    def send(n: int) -> None:
        with httpx.Client(base_url=url, timeout=10) as c:
            for i in range(n, deliveries, senders):
                if i + senders >= deliveries:  # each sender's last delivery waits for the last kill,
                    killed_all.wait(timeout=300)  # so a fast service cannot finish before it lands
                body = json.dumps(issue_event(issue_id=f"kill-{i}")).encode()
                headers = {"Linear-Signature": sign(SECRET, body), "Linear-Delivery": f"kill-delivery-{i}"}
                while True:
                    try:
                        r = c.post("/webhook", content=body, headers=headers)
                        if r.status_code == 200:
                            with lock:
                                results[f"kill-delivery-{i}"] = r.json()
                            break
                        assert r.status_code == 503, r.text
                    except httpx.HTTPError:
                        pass
                    with lock:
                        retries[0] += 1
                    time.sleep(0.05)

    planned = 6 if heavy else 3

    def killer() -> None:
        # Each kill lands at its share of the way through the deliveries (plus jitter), so a faster
        # service is killed as often as a slower one.
        rng = random.Random(3)
        for k in range(planned):
            while not done.is_set() and len(results) < deliveries * (k + 1) / (planned + 1):
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.2))
            if done.is_set():
                break
            server[0].send_signal(signal.SIGKILL)
            server[0].wait()
            kills[0] += 1
            server[0] = start_serve(db_url, port)
        killed_all.set()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(senders)]
    k = threading.Thread(target=killer)
    for t in threads:
        t.start()
    k.start()
    for t in threads:
        t.join(timeout=900)
    done.set()
    k.join()
    server[0].kill()
    server[0].wait()
    print(f"reliability: {deliveries} deliveries, {kills[0]} SIGKILLs, {retries[0]} retries")
    assert len(results) == deliveries
    assert kills[0] == planned
    assert_invariant(pool)
    sessions = {r["sessionId"] for r in results.values()}
    assert len(sessions) == deliveries  # a retried delivery never made a second session
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS n FROM dispatch_sessions").fetchone()
    assert row is not None and row["n"] == deliveries
    claimed: list[UUID] = []
    while batch := claim(pool, orch.id, max=100, lease_seconds=600):
        claimed.extend(m.session_id for m in batch)
    assert len(claimed) == deliveries and {str(s) for s in claimed} == sessions


def test_release_racing_sweep_counts_one_failed_attempt(pool: Pool, make_orchestrator: MakeOrch) -> None:
    o = make_orchestrator()
    n = 300
    for i in range(n):
        enqueue_one(pool, o, i)
    settings = Settings()
    t0 = datetime.now(UTC) + timedelta(days=1)
    msgs = claim(pool, o.id, max=1000, lease_seconds=60, now=t0)
    later = t0 + timedelta(seconds=61)
    released: list[str] = []
    sweeps = []
    barrier = threading.Barrier(2)

    def releaser() -> None:
        barrier.wait()
        for m in msgs:
            released.append(release(pool, settings, o.id, m.queue_id, m.claim_token, now=later).status)

    def sweeper() -> None:
        barrier.wait()
        for _ in range(10):
            sweeps.append(sweep(pool, settings, now=later).requeued)

    ts = [threading.Thread(target=releaser), threading.Thread(target=sweeper)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert released.count("released") == n  # either it released, or the sweep had ended the claim
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n, min(attempts) AS lo, max(attempts) AS hi,"
            " count(*) FILTER (WHERE lease_expires_at IS NULL) AS free FROM dispatch_queue"
        ).fetchone()
    assert row is not None and (row["n"], row["lo"], row["hi"], row["free"]) == (n, 1, 1, n)
    assert_invariant(pool)


def test_claim_racing_revoke(api: Api) -> None:
    oid, token = api.register()
    for i in range(20):
        api.webhook(issue_event(issue_id=f"rv-{i}"))
    codes: list[tuple[float, int]] = []
    stop = threading.Event()

    def claimer() -> None:
        with httpx.Client(base_url=api.url, timeout=10) as c:
            while not stop.is_set():
                sent = time.monotonic()
                r = c.post("/claim", json={"max": 1}, headers={"Authorization": f"Bearer {token}"})
                codes.append((sent, r.status_code))

    ts = [threading.Thread(target=claimer) for _ in range(4)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 10  # the claimers are polling (a slow host takes a while to start them)
    while not any(c == 200 for _, c in list(codes)) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert revoke(api.pool, UUID(oid))
    revoked_at = time.monotonic()
    time.sleep(0.3)
    stop.set()
    for t in ts:
        t.join()
    assert {c for _, c in codes} <= {200, 401}
    # a request sent after the revocation committed never succeeds (one sent before may still be
    # answered after it, on a busy host: the time kept is when each was sent)
    assert all(c == 401 for sent, c in codes if sent > revoked_at)
    assert any(c == 200 for _, c in codes)


def test_a_header_that_never_ends_does_not_hold_the_server(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from devpilot.serve import QuietHandler

    monkeypatch.setattr(QuietHandler, "timeout", 2)
    host, port = api.url.removeprefix("http://").split(":")
    slow = [socket.create_connection((host, int(port))) for _ in range(20)]
    for s in slow:
        s.sendall(b"POST /claim HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never more
    t = time.monotonic()
    assert api.http.get("/healthz").json() == {"ok": True}  # others are served meanwhile
    assert time.monotonic() - t < 2
    closed = 0
    for s in slow:
        s.settimeout(10)  # the server hangs up (or answers 408) after its 2 s timeout, not never
        try:
            data = s.recv(1024)
            closed += data == b"" or data.startswith(b"HTTP/1.1 408")
        except ConnectionResetError:
            closed += 1
        s.close()
    assert closed == len(slow)


def test_cancel_racing_ack_yields_exactly_one_outcome(pool: Pool, make_orchestrator: MakeOrch) -> None:
    """Issues unassigned (each its own transaction of assignment changes, as the service writes it)
    while their machine acks their dispatches: each dispatch is either delivered or cancelled, never
    both or neither."""
    from shared.delivery.queue import ack
    from tests.helpers.batches import unassign
    from tests.helpers.data import issue

    o = make_orchestrator()
    n = 300
    for i in range(n):
        enqueue_one(pool, o, i)
    msgs = claim(pool, o.id, max=1000, lease_seconds=600)
    by_session = {m.session_id: m for m in msgs}
    acked: dict[UUID, str] = {}
    cancelled: list[UUID] = []
    barrier = threading.Barrier(2)

    def acker() -> None:
        barrier.wait()
        for m in msgs:
            acked[m.session_id] = ack(pool, o.id, m.queue_id, m.claim_token)

    def canceller() -> None:
        barrier.wait()
        for i in range(n):
            answer = unassign(pool, o.org_id, issue(i, o.org_id).id)
            if answer["status"] == "cancelled":
                cancelled.append(UUID(answer["sessionId"]))

    ts = [threading.Thread(target=acker), threading.Thread(target=canceller)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert set(by_session) == set(acked)
    for sid, outcome in acked.items():
        assert (outcome == "acked") != (sid in cancelled)  # one or the other, never both or neither
        assert outcome in ("acked", "not_found")
    assert_invariant(pool)
