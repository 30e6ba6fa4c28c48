"""An engineer's machine, connected by `devpilot-orchestrator login`, takes the issues assigned to
them: real processes (`devpilot serve`, the CLI, the orchestrator, its COMMAND), the stand-in
Linear, and no admin call anywhere (the service has no admin token at all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
from pytest_httpserver import HTTPServer

from shared.linear.webhooks import sign
from tests.helpers.api import SECRET, issue_event
from tests.helpers.browser import Browser
from tests.helpers.data import ENCRYPTION_KEY
from tests.helpers.linear import LinearOAuth, person
from tests.helpers.serving import free_port, start_serve, wait_healthy

ROOT = Path(__file__).parent.parent
ACME = LinearOAuth.ORG


def test_a_machine_connected_by_login_takes_its_persons_issues_with_no_admin_call(
    db_url: str, httpserver: HTTPServer, tmp_path: Path
) -> None:
    linear = LinearOAuth(httpserver)
    linear.people = {"u-alice": person("u-alice", "Alice Example", ACME)}
    linear.signed_in = "u-alice"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = start_serve(
        db_url,
        port,
        {
            "DEVPILOT_ADMIN_TOKEN": "",  # no operator here: every admin route would answer 401
            "DEVPILOT_PUBLIC_URL": url,
            "DEVPILOT_ENCRYPTION_KEYS": ENCRYPTION_KEY,
            "LINEAR_API_URL": httpserver.url_for("/graphql"),
            "LINEAR_OAUTH_AUTHORIZE_URL": httpserver.url_for("/oauth/authorize"),
            "LINEAR_OAUTH_TOKEN_URL": httpserver.url_for("/oauth/token"),
            "LINEAR_OAUTH_REVOKE_URL": httpserver.url_for("/oauth/revoke"),
            "LINEAR_CLIENT_ID": "client-id",
            "LINEAR_CLIENT_SECRET": "client-secret",
            "LINEAR_SIGNIN_CLIENT_ID": LinearOAuth.SIGNIN_CLIENT[
                0
            ],  # people sign in with a client of their own
            "LINEAR_SIGNIN_CLIENT_SECRET": LinearOAuth.SIGNIN_CLIENT[1],
        },
    )
    env = {k: v for k, v in os.environ.items() if k != "DEVPILOT_ORCHESTRATOR_TOKEN"}
    env |= {"PYTHONPATH": str(ROOT), "BROWSER": "true"}
    procs: list[subprocess.Popen[str]] = [serve]
    browser = Browser()
    try:
        wait_healthy(url)
        # the workspace's admin installs the app (OAuth, in their browser: no admin token involved)
        state = parse_qs(urlsplit(httpx.get(f"{url}/oauth/install").headers["Location"]).query)["state"][0]
        assert (
            httpx.get(f"{url}/oauth/callback", params={"code": "good-code", "state": state}).status_code
            == 200
        )
        # the engineer connects their laptop
        state_dir = tmp_path / "state"
        login = subprocess.Popen(
            [
                *(sys.executable, "-m", "orchestrator.cli", "login"),
                *("--url", url, "--name", "alices-laptop", "--state-dir", str(state_dir)),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(login)
        assert login.stdout is not None
        link = login.stdout.readline().removeprefix("Open this link to sign in: ").strip()
        assert browser.go(link).status_code == 200
        out, err = login.communicate(timeout=30)
        assert login.returncode == 0, err
        assert out.strip().endswith("Registered alices-laptop for Alice Example in Acme Robotics")
        assert linear.authorized[-1]["client_id"] == LinearOAuth.SIGNIN_CLIENT[0]
        # ... and runs the orchestrator: no --url, no --token (both from the login)
        started = tmp_path / "started.jsonl"
        orch = subprocess.Popen(
            [
                *(
                    sys.executable,
                    "-m",
                    "orchestrator.cli",
                    "--state-dir",
                    str(state_dir),
                    "--transport",
                    "listen",
                ),
                *("--", sys.executable, str(ROOT / "tests" / "helpers" / "record_start.py"), str(started)),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(orch)
        # Linear: an issue is assigned to Alice
        body = json.dumps(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-alice")).encode()
        r = httpx.post(
            f"{url}/webhook",
            content=body,
            headers={"Linear-Signature": sign(SECRET, body), "Linear-Delivery": "d-1"},
        )
        assert r.json()["status"] == "dispatched", r.text
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (started.exists() and started.read_text().strip()):
            time.sleep(0.1)
        [ran] = [json.loads(line) for line in started.read_text().splitlines()]
        assert ran["identifier"] == "ENG-42" and ran["messageId"] == r.json()["messageId"]
        assert httpx.get(f"{url}/orchestrators", headers={"Authorization": "Bearer x"}).status_code == 401
    finally:
        browser.close()
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
            p.wait()
