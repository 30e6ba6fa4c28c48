"""Long-polls at the edges: a client that died mid-wait does not swallow work, a revoke ends an open
long-poll, and the orchestrator stops promptly while one is open."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from shared.dispatch import RECHECK_SECONDS
from tests.helpers.api import Api, issue_event
from tests.test_orchestrator import Orch, wait_for


def open_and_abandon_long_poll(api: Api, token: str) -> socket.socket:
    """A long-poll whose client is gone without a word (killed; a lid closed; the network lost)."""
    url = urlsplit(api.url)
    s = socket.create_connection((url.hostname or "127.0.0.1", url.port or 80))
    body = json.dumps({"waitSeconds": 20}).encode()
    s.sendall(
        b"POST /claim HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return s


def test_work_arriving_after_a_client_died_mid_long_poll_is_claimed_again_at_attempt_1(api: Api) -> None:
    _, token = api.register()
    dead = open_and_abandon_long_poll(api, token)
    time.sleep(1.0)  # the server is waiting on it
    dead.close()
    t0 = time.monotonic()
    sent = api.webhook(issue_event(issue_id="after-death")).json()
    got: list[dict[str, Any]] = []
    while time.monotonic() - t0 < 10 and not got:
        got = api.post_as(token, "/claim", {}).json()["messages"]
        time.sleep(0.25)
    assert got, "the message stayed with the dead long-poll"
    [m] = got
    assert m["messageId"] == sent["messageId"] and m["attempt"] == 1
    assert time.monotonic() - t0 < 10
    assert (
        api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]}).status_code
        == 200
    )


def test_a_live_long_poll_gets_the_work_and_acks_it(api: Api) -> None:
    _, token = api.register()
    result: list[Any] = []
    t = threading.Thread(
        target=lambda: result.append(api.post_as(token, "/claim", {"waitSeconds": 10}).json())
    )
    t.start()
    time.sleep(0.5)
    sent = api.webhook(issue_event(issue_id="live")).json()
    t.join(timeout=15)
    [m] = result[0]["messages"]
    assert m["messageId"] == sent["messageId"] and m["attempt"] == 1
    assert api.post_as(token, "/claim", {}).json() == {"messages": []}  # nobody else gets it meanwhile
    assert api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]}).json() == {
        "status": "acked"
    }
    with api.pool.connection() as conn:
        row = conn.execute("SELECT status FROM dispatch_sessions WHERE id = %s", (m["sessionId"],)).fetchone()
    assert row == {"status": "delivered"}


def test_a_long_poll_that_finds_work_waiting_takes_it_at_once_under_the_full_lease(api: Api) -> None:
    """Work already queued when a long-poll starts (a laptop back after a night offline) is taken by
    its first look, under the ordinary lease (60 s by default): not left for a wake-up, and not
    handed over with the short lease kept for work that arrives while the client may be gone."""
    _, token = api.register()
    sent = api.webhook(issue_event(issue_id="waiting")).json()
    asked = datetime.now(UTC)
    [m] = api.post_as(token, "/claim", {"waitSeconds": 20}).json()["messages"]
    assert m["messageId"] == sent["messageId"] and m["attempt"] == 1
    assert datetime.fromisoformat(m["leaseExpiresAt"]) - asked > timedelta(seconds=30)


def test_revoking_a_machine_ends_its_open_long_poll(api: Api) -> None:
    """At once (the revoke's NOTIFY wakes it, not the re-check), and with 401 — while other machines
    stay active (the revoked check is about this machine, not any)."""
    oid, token = api.register()
    api.register(user="user-2")  # another machine, active throughout
    result: list[Any] = []

    def poll() -> None:
        t0 = time.monotonic()
        r = api.post_as(token, "/claim", {"waitSeconds": 20})
        result.append((r.status_code, r.json(), time.monotonic() - t0))

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)
    api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin())
    t.join(timeout=25)
    status, body, took = result[0]
    assert (status, body["error"]) == (401, "unauthorized")
    assert took < 0.5 + RECHECK_SECONDS / 2, took  # woken by the revoke, not found by the re-check


def long_polling(api: Api, oid: str) -> bool:
    """The machine's long-poll is waiting in the service (not merely started: on a loaded host an
    orchestrator's start-up alone can take seconds)."""
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT listening_until > now() AS yes FROM orchestrators WHERE id = %s", (oid,)
        ).fetchone()
    return bool(row and row["yes"])


def test_orchestrator_sigkilled_mid_long_poll_gets_the_next_work_at_attempt_1(
    api: Api, tmp_path: Path
) -> None:
    oid, token = api.register()
    o = Orch(api.url, token, tmp_path, transport="listen")
    o.start()
    wait_for(lambda: long_polling(api, oid), 30, "the orchestrator's long-poll to wait")
    o.signal(signal.SIGKILL)
    assert o.proc is not None
    o.proc.wait()
    t0 = time.monotonic()
    sent = api.webhook(issue_event(issue_id="after-kill")).json()
    time.sleep(1.0)
    o.start()
    wait_for(lambda: len(o.starts()) == 1, timeout=15, what="the start after the restart")
    assert time.monotonic() - t0 < 10
    assert o.starts()[0]["messageId"] == sent["messageId"]
    assert "claimed ENG-42 (attempt 1)" in o.log()
    assert o.stop() == 0


def test_sigterm_during_a_long_poll_ends_the_orchestrator_within_2_seconds(api: Api, tmp_path: Path) -> None:
    oid, token = api.register()
    o = Orch(api.url, token, tmp_path, transport="listen")
    o.start()
    wait_for(lambda: long_polling(api, oid), 30, "the orchestrator's long-poll to wait")
    time.sleep(0.2)
    t0 = time.monotonic()
    o.signal(signal.SIGTERM)
    assert o.proc is not None and o.proc.wait(timeout=10) == 0
    assert time.monotonic() - t0 < 2
