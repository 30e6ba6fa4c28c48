"""`devpilot demo`: the whole loop on an embedded database in a few seconds.

Starts `devpilot serve` (embedded Postgres in a temporary folder), registers an orchestrator, runs
`devpilot-orchestrator` with a sample agent command, sends two signed sample Linear webhooks (an
assignment and an agent session), prints the timeline from webhook to agent start, cleans up.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from shared.linear import sign

SAMPLE_AGENT = """
import json, os, sys, time
m = json.load(sys.stdin)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"messageId": m["messageId"], "startedAt": time.time()}) + "\\n")
print(f"  [agent] working on {os.environ['DEVPILOT_ISSUE_IDENTIFIER']}: {m['issue']['title']}", flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"demo: timed out waiting for {what}")


def run_demo() -> int:
    t_begin = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="devpilot-demo-"))
    admin, secret = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DATABASE_LISTEN_URL")}
    env.update(
        {
            "DEVPILOT_HOME": str(home / ".devpilot"),
            "DEVPILOT_ADMIN_TOKEN": admin,
            "LINEAR_WEBHOOK_SECRET": secret,
        }
    )
    procs: list[subprocess.Popen[bytes]] = []
    print(f"demo: starting devpilot serve on {url} with an embedded Postgres in {home}")
    try:
        server = subprocess.Popen(
            [sys.executable, "-m", "devpilot", "serve", "--port", str(port)],
            cwd=home,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(server)
        http = httpx.Client(base_url=url, timeout=10)
        _wait(lambda: http.get("/healthz").status_code == 200, 60, "the service")
        print(f"demo: service up after {time.monotonic() - t_begin:.1f}s")

        reg = http.post(
            "/orchestrators",
            headers={"Authorization": f"Bearer {admin}"},
            json={"orgId": "demo-org", "linearUserId": "demo-user", "name": "demo-laptop"},
        ).json()
        print(f"demo: registered orchestrator {reg['orchestratorId']} for demo-user")
        started_file = home / "started.jsonl"
        started_file.touch()
        orch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "--url",
                url,
                "--token",
                reg["token"],
                "--transport",
                "listen",
                "--state-dir",
                str(home / "state"),
                "--",
                sys.executable,
                "-c",
                SAMPLE_AGENT,
                str(started_file),
            ],
            env=env,
        )
        procs.append(orch)
        time.sleep(0.8)  # let it connect and start its first long-poll

        now = int(time.time() * 1000)
        events = [
            (
                "issue assigned",
                {
                    "type": "Issue",
                    "action": "create",
                    "organizationId": "demo-org",
                    "webhookTimestamp": now,
                    "data": {
                        "id": "demo-issue-1",
                        "identifier": "DEMO-1",
                        "title": "Fix the login redirect",
                        "url": "https://linear.app/demo/issue/DEMO-1",
                        "description": "Sample issue",
                        "assigneeId": "demo-user",
                        "updatedAt": "2026-12-02T10:00:00.000Z",
                    },
                },
            ),
            (
                "agent session",
                {
                    "type": "AgentSessionEvent",
                    "action": "created",
                    "organizationId": "demo-org",
                    "webhookTimestamp": now,
                    "agentSession": {
                        "id": "demo-agent-session",
                        "creatorId": "demo-user",
                        "issue": {
                            "id": "demo-issue-2",
                            "identifier": "DEMO-2",
                            "title": "Write the release notes",
                            "url": "https://linear.app/demo/issue/DEMO-2",
                        },
                    },
                },
            ),
        ]
        sent: dict[str, tuple[str, float, float]] = {}
        for label, event in events:
            body = json.dumps(event).encode()
            t0 = time.time()
            r = http.post(
                "/webhook",
                content=body,
                headers={"Linear-Signature": sign(secret, body), "Linear-Delivery": secrets.token_hex(8)},
            )
            answer = r.json()
            sent[answer["messageId"]] = (label, t0, time.time())
            print(f"demo: webhook '{label}' -> {r.status_code} {answer['status']}")

        def starts() -> dict[str, float]:
            lines = [json.loads(x) for x in started_file.read_text().splitlines() if x.strip()]
            return {x["messageId"]: x["startedAt"] for x in lines}

        _wait(lambda: set(starts()) >= set(sent), 20, "the agent starts")
        print("\ntimeline (webhook sent -> 200 -> agent started):")
        for mid, (label, t0, t1) in sent.items():
            t2 = starts()[mid]
            print(
                f"  {label:<15} 200 after {(t1 - t0) * 1000:6.1f} ms, agent started after {(t2 - t0) * 1000:6.1f} ms"
            )
        with httpx.Client(base_url=url) as c:
            listed = c.get("/orchestrators", headers={"Authorization": f"Bearer {admin}"}).json()
        print(f"\ndemo: orchestrator last seen {listed['orchestrators'][0]['lastSeenAt']}")
        return 0
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(home, ignore_errors=True)
        print(f"demo: cleaned up; {time.monotonic() - t_begin:.1f}s in all")
