"""The cloud shape, for real: every route its own `functions-framework` process on its own port (as
Cloud Run and Lambda run them), and an orchestrator given only the endpoints map takes a webhook's
work to the agent start. The `api` target serves every route by path on one URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.linear.webhooks import sign
from shared.plumbing.db import Pool
from tests.helpers.api import ADMIN, SECRET, issue_event
from tests.helpers.data import MakeOrch, enqueue_one
from tests.helpers.fresh_python import run_json
from tests.helpers.serving import free_ports
from tests.test_orchestrator import ROOT, Orch, wait_for

TARGETS = ("webhook", "claim", "ack", "release", "activities", "orchestrators", "api")


@pytest.fixture
def functions(db_url: str) -> Iterator[dict[str, str]]:
    ports = dict(zip(TARGETS, free_ports(len(TARGETS)), strict=True))
    urls = {t: f"http://127.0.0.1:{p}/" for t, p in ports.items()}
    endpoints = {
        "claim": urls["claim"],
        "ack": urls["ack"],
        "release": urls["release"],
        "activities": urls["activities"],
    }
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_url,
        "DEVPILOT_ADMIN_TOKEN": ADMIN,
        "LINEAR_WEBHOOK_SECRET": SECRET,
        "DEVPILOT_ENDPOINTS": json.dumps(endpoints),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "functions_framework",
                "--source",
                "functions/main.py",
                "--target",
                t,
                "--port",
                str(p),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for t, p in ports.items()
    ]
    try:
        for url in urls.values():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    httpx.get(url, timeout=2)
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
        yield urls
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_an_orchestrator_with_only_the_endpoints_map_gets_the_work(
    functions: dict[str, str], tmp_path: Path
) -> None:
    reg = httpx.post(
        functions["orchestrators"],
        json={"orgId": "org-a", "linearUserId": "user-1", "name": "laptop"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert reg.status_code == 201, reg.text
    endpoints = reg.json()["endpoints"]  # the deployment hands the map out at registration
    assert endpoints["claim"] == functions["claim"]
    o = Orch("", reg.json()["token"], tmp_path, extra=["--endpoints", json.dumps(endpoints)])
    o.args.remove("--url")
    o.args.remove("")
    o.start()
    body = json.dumps(issue_event(issue_id="cloud-1")).encode()
    sent = httpx.post(functions["webhook"], content=body, headers={"Linear-Signature": sign(SECRET, body)})
    assert sent.json()["status"] == "dispatched"
    wait_for(lambda: len(o.starts()) == 1, timeout=30, what="the agent start through the endpoints map")
    assert o.starts()[0]["messageId"] == sent.json()["messageId"]
    assert "acked ENG-42" in o.log()
    assert o.stop() == 0


def test_the_api_target_serves_every_route_by_path(functions: dict[str, str]) -> None:
    api = functions["api"].rstrip("/")
    assert httpx.get(api + "/healthz").json() == {"ok": True}
    assert httpx.post(api + "/claim", json={}).status_code == 401
    listed = httpx.get(api + "/orchestrators", headers={"Authorization": f"Bearer {ADMIN}"})
    assert listed.status_code == 200 and "orchestrators" in listed.json()
    assert httpx.get(api + "/nowhere").json()["error"] == "not_found"


# One request to one target of a fresh process (a cold instance): the answer, the libraries that
# serving it loaded, and the claims it counted.
ONE_REQUEST = """
import json, sys, functions_framework
target, body, headers = sys.argv[1], sys.argv[2].encode(), json.loads(sys.argv[3])
app = functions_framework.create_app(target, "functions/main.py")
r = app.test_client().post("/", data=body, headers={"Content-Type": "application/json", **headers})
loaded = [m for m in ("prometheus_client", "httpx") if m in sys.modules]
if "prometheus_client" in loaded:
    from functions.telemetry import meters
    claimed = meters().registry.get_sample_value("devpilot_claimed_messages_total")
else:
    claimed = None
print(json.dumps({"status": r.status_code, "body": r.get_json(), "loaded": loaded, "claimed": claimed}))
"""


def cold_request(db_url: str, target: str, body: bytes, headers: dict[str, str], **env: str) -> Any:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": db_url, **env}
    if not env.get("DEVPILOT_METRICS"):
        environ.pop("DEVPILOT_METRICS", None)
    return run_json(ONE_REQUEST, target, body.decode(), json.dumps(headers), env=environ)


@pytest.mark.parametrize("metrics", [False, True])
def test_a_cold_claim_loads_the_metrics_library_only_when_metrics_are_on(
    db_url: str, pool: Pool, make_orchestrator: MakeOrch, metrics: bool
) -> None:
    """An instance that never serves /metrics does not import prometheus_client (cold start);
    with DEVPILOT_METRICS on, the same claim is counted."""
    orch = make_orchestrator()
    enqueue_one(pool, orch, 1)
    enqueue_one(pool, orch, 2)
    seen = cold_request(
        db_url,
        "claim",
        b'{"max": 5}',
        {"Authorization": f"Bearer {orch.token}"},
        DEVPILOT_METRICS="1" if metrics else "",
    )
    assert (seen["status"], len(seen["body"]["messages"])) == (200, 2)
    assert ("prometheus_client" in seen["loaded"]) is metrics
    assert seen["claimed"] == (2.0 if metrics else None)


def test_a_cold_webhook_that_posts_nothing_to_linear_loads_no_http_client(
    db_url: str, make_orchestrator: MakeOrch
) -> None:
    """httpx (about 50 ms of a cold start) is loaded by the instances that call Linear, when they do."""
    make_orchestrator(org_id="org-a", linear_user_id="user-1")
    body = json.dumps(issue_event(issue_id="cold-1")).encode()
    seen = cold_request(
        db_url, "webhook", body, {"Linear-Signature": sign(SECRET, body)}, LINEAR_WEBHOOK_SECRET=SECRET
    )
    assert (seen["status"], seen["body"]["status"]) == (200, "dispatched")
    assert seen["loaded"] == []
