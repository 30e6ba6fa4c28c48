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

import httpx
import pytest

from shared.linear import sign
from tests.helpers.api import ADMIN, SECRET, issue_event
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
