"""Bad input gets its 4xx (or a quiet close), writes nothing, and leaves no traceback in the log:
deeply nested JSON, a client that disconnects in the middle of its body, a non-ASCII signature —
through the in-process app and through `devpilot serve` (Granian) itself."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.db import Pool
from shared.orchestrators import register
from tests.helpers.api import SECRET, Api
from tests.helpers.data import row_counts
from tests.helpers.serving import free_port, start_serve, wait_healthy

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


def _sig(body: bytes) -> str:
    from shared.linear import sign

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
