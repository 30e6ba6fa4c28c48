"""The Lambda entry points fed real Function URL (payload 2.0) and EventBridge Scheduler events."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from functions import aws, runtime
from shared.delivery.wakeups import Wakeups
from shared.linear.webhooks import sign
from shared.plumbing.db import Pool
from shared.plumbing.embedded import Database
from tests.helpers.api import ADMIN, SECRET, issue_event
from tests.helpers.data import api_settings


@pytest.fixture
def lambda_runtime(db_url: str, pool: Pool) -> Iterator[None]:
    runtime.install(runtime.Runtime(api_settings(), Database(db_url, False), pool, Wakeups(db_url)))
    yield
    runtime.install(None)


def url_event(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None, b64: bool = False
) -> dict[str, Any]:
    """A Lambda Function URL event as AWS sends it (payload format version 2.0)."""
    hdrs = {
        "host": "abc123.lambda-url.us-east-1.on.aws",
        "x-forwarded-proto": "https",
        "content-type": "application/json",
        "user-agent": "test",
    }
    hdrs.update({k.lower(): v for k, v in (headers or {}).items()})
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": hdrs,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "abc123",
            "domainName": "abc123.lambda-url.us-east-1.on.aws",
            "domainPrefix": "abc123",
            "requestId": "req-1",
            "routeKey": "$default",
            "stage": "$default",
            "time": "02/Dec/2026:10:00:00 +0000",
            "timeEpoch": 1796205600000,
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": "test",
            },
        },
        "body": base64.b64encode(body).decode() if b64 else body.decode(),
        "isBase64Encoded": b64,
    }


def call(handler: Any, event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    out = handler(event, None)
    body = out["body"]
    if out.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    return out["statusCode"], json.loads(body)


def test_full_loop_through_lambda_handlers(lambda_runtime: None) -> None:
    admin = {"authorization": f"Bearer {ADMIN}"}
    status, reg = call(
        aws.orchestrators,
        url_event(
            "POST",
            "/",
            json.dumps({"orgId": "org-a", "linearUserId": "user-1", "name": "lap"}).encode(),
            admin,
        ),
    )
    assert status == 201
    token = {"authorization": f"Bearer {reg['token']}"}
    status, listed = call(aws.orchestrators, url_event("GET", "/", b"", admin))
    assert status == 200 and len(listed["orchestrators"]) == 1

    body = json.dumps(issue_event()).encode()
    status, hook = call(
        aws.webhook,
        url_event(
            "POST",
            "/",
            body,
            {"linear-signature": sign(SECRET, body), "linear-delivery": "lambda-1"},
            b64=True,
        ),
    )
    assert status == 200 and hook["status"] == "dispatched"
    status, bad = call(aws.webhook, url_event("POST", "/", body, {"linear-signature": "00"}))
    assert status == 401 and bad["error"] == "bad_signature"

    status, claimed = call(aws.claim, url_event("POST", "/", b"{}", token))
    assert status == 200 and claimed["messages"][0]["queueId"] == hook["queueId"]
    m = claimed["messages"][0]
    status, acked = call(
        aws.ack,
        url_event(
            "POST", "/", json.dumps({"queueId": m["queueId"], "claimToken": m["claimToken"]}).encode(), token
        ),
    )
    assert (status, acked) == (200, {"status": "acked"})

    assert call(aws.healthz, url_event("GET", "/"))[1] == {"ok": True}
    assert call(aws.sweep, url_event("POST", "/", b"", admin)) == (200, {"requeued": 0, "deadLettered": 0})
    assert call(aws.sweep, url_event("POST", "/", b"", token))[0] == 401
    status, _ = call(aws.orchestrators, url_event("POST", f"/{reg['orchestratorId']}/revoke", b"", admin))
    assert status == 200
    assert call(aws.claim, url_event("POST", "/", b"{}", token))[0] == 401


def test_sweep_accepts_an_eventbridge_scheduler_event(lambda_runtime: None) -> None:
    scheduled = {
        "version": "0",
        "id": "e-1",
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": "123456789012",
        "time": "2026-12-02T10:00:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/devpilot-sweep"],
        "detail": {},
    }
    assert aws.sweep(scheduled, None) == {"requeued": 0, "deadLettered": 0}
    assert aws.sweep({}, None) == {"requeued": 0, "deadLettered": 0}
