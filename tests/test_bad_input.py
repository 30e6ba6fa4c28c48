"""Bad input gets its 4xx (or a quiet close), writes nothing, and leaves no traceback in the log:
deeply nested JSON, a client that disconnects in the middle of its body, a non-ASCII signature —
through the in-process app and through `devpilot serve` (Granian) itself."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.fleet.orchestrators import register
from shared.plumbing.db import Pool
from tests.helpers.api import SECRET, Api, issue_event
from tests.helpers.data import row_counts
from tests.helpers.serving import free_port, raw_exchange, start_serve, wait_healthy

ROOT = Path(__file__).parent.parent
DEEP = b"[" * 100_000 + b"]" * 100_000
NESTED = b'{"a":' * 100 + b"1" + b"}" * 100


def test_deep_nesting_is_400_everywhere_and_writes_nothing(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    _, token = api.register()
    before = row_counts(api.pool)
    for body in (DEEP, NESTED):
        r = api.http.post("/webhook", content=body, headers={"Linear-Signature": _sig(body)})
        assert (r.status_code, r.json()["error"]) == (400, "bad_request")
        for path in ("/claim", "/ack", "/release", "/activities"):
            r = api.http.post(path, content=body, headers={"Authorization": f"Bearer {token}"})
            assert (r.status_code, r.json()["error"]) == (400, "bad_request"), path
        r = api.http.post("/orchestrators", content=body, headers=api.admin())
        assert r.status_code == 400
    assert row_counts(api.pool) == before
    assert "Traceback" not in caplog.text and "unhandled" not in caplog.text


def test_a_nul_or_one_level_too_many_is_refused_and_what_only_looks_like_them_is_not(api: Api) -> None:
    """Postgres cannot store U+0000 and nesting is capped at 64 levels. A body is searched only
    where it could break either rule; these cases sit on each side of that line."""
    api.register(user="user-1")

    def nested(levels: int) -> Any:
        value: Any = 1
        for _ in range(levels):
            value = {"a": value}
        return value

    def hook(**extra: Any) -> dict[str, Any]:
        event = issue_event(assignee="user-1", issue_id=f"issue-{uuid.uuid4()}")
        event.update(extra)
        return event

    before = row_counts(api.pool)
    nul, deep = "must not contain NUL", "nested deeper than 64 levels"
    refused = [
        (json.dumps(hook(note="a\x00b")).encode(), nul),  # in a value: json.dumps writes \u0000
        (json.dumps(hook(**{"k\x00": 1})).encode(), nul),  # in a key
        (json.dumps(hook(note="a\x00b")).encode("utf-16"), nul),  # a UTF-16 body is JSON too
        (json.dumps(hook(deep=nested(64))).encode(), deep),  # 65 levels, with the event's own
    ]
    for body, why in refused:
        r = api.webhook({}, raw=body)
        assert (r.status_code, r.json()["error"]) == (400, "bad_request"), r.text
        assert why in r.json()["detail"]
    assert row_counts(api.pool) == before
    accepted = [
        json.dumps(hook(note="a\\u0000b")).encode(),  # an escaped backslash, then "u0000": no NUL
        json.dumps(hook(note="{[" * 40, deep=nested(63))).encode(),  # 64 levels, brackets in a string
    ]
    for body in accepted:
        r = api.webhook({}, raw=body)
        assert (r.status_code, r.json()["status"]) == (200, "dispatched"), r.text


def _sig(body: bytes) -> str:
    from shared.linear.webhooks import sign

    return sign(SECRET, body)


@pytest.fixture
def served(pool: Pool, db_url: str) -> Iterator[tuple[str, str, subprocess.Popen[str]]]:
    """`devpilot serve` as users run it."""
    token = register(pool, org_id="org-a", linear_user_id="u", name="m").token
    port = free_port()
    proc = start_serve(db_url, port, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    yield url, token, proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_a_client_gone_mid_body_and_odd_signatures_on_the_real_server(
    served: tuple[str, str, subprocess.Popen[str]], pool: Pool
) -> None:
    url, token, proc = served
    before = row_counts(pool)
    port = int(url.rsplit(":", 1)[1])
    for path, auth in (("/webhook", "Linear-Signature: 00"), ("/claim", f"Authorization: Bearer {token}")):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\nContent-Length: 5000\r\n\r\n".encode()
            + b'{"type": "Iss'
        )
        s.close()  # gone, 4,987 bytes short
    for signature in ("é" * 64, "☃", "", "a" * 70_000):
        r = httpx.post(url + "/webhook", content=b"{}", headers={b"Linear-Signature": signature.encode()})
        assert r.status_code in (401, 431), signature[:5]
    r = httpx.post(url + "/claim", content=DEEP, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 400
    assert httpx.get(url + "/healthz").json() == {"ok": True}
    assert row_counts(pool) == before
    time.sleep(0.5)
    proc.terminate()
    _, stderr = proc.communicate(timeout=30)
    assert '"route":"claim"' in stderr  # its request log is here, and nothing went wrong in it
    assert "Traceback" not in stderr and '"status":500' not in stderr


def test_a_large_body_sent_in_pieces_is_read_whole_by_the_real_server(
    served: tuple[str, str, subprocess.Popen[str]], pool: Pool
) -> None:
    # The app reads a body's declared length in one read of the server's stream: a body that
    # arrives in pieces, with pauses between them, is still read whole (and one that ends short is
    # refused, in tests/test_http.py).
    url, token, _ = served
    event = issue_event(assignee="u", issue_id="big")
    event["data"]["description"] = "d" * 900_000
    body = json.dumps(event).encode()
    head = (
        f"POST /webhook HTTP/1.1\r\nHost: x\r\nLinear-Signature: {_sig(body)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}"
    )
    status, payload = raw_exchange(url, head, body, pieces=300_000, pause=0.3)
    assert status == 200, payload
    assert json.loads(payload)["status"] == "dispatched"
    r = httpx.post(url + "/claim", json={}, headers={"Authorization": f"Bearer {token}"})
    assert [m["issue"]["description"] for m in r.json()["messages"]] == ["d" * 900_000]
