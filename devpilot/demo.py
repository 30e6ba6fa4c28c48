"""`devpilot demo`: the whole loop on an embedded database in a few seconds.

Starts a local stand-in for Linear's GraphQL API and `devpilot serve` (embedded Postgres in a
temporary folder), registers an orchestrator, runs `devpilot-orchestrator` with a sample agent
command, sends signed sample Linear webhooks (an assignment, then a whole agent conversation:
created, a long task, a follow-up that reaches the agent while it works, and Linear's stop),
prints the timeline from webhook to agent start and what Linear would show in the agent session,
and cleans up.
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
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from shared.linear import sign

SAMPLE_AGENT = """
import json, os, subprocess, sys, time
from pathlib import Path
m = json.load(sys.stdin)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"messageId": m["messageId"], "startedAt": time.time()}) + "\\n")
issue, kind = os.environ["DEVPILOT_ISSUE_IDENTIFIER"], os.environ["DEVPILOT_KIND"]
asked = m["prompt"]["body"] if m.get("prompt") and m["prompt"].get("body") else m["issue"]["title"]
print(f"  [agent {os.getpid()}] working on {issue} ({kind}): {asked}", flush=True)
if os.environ.get("DEVPILOT_AGENT_SESSION_ID"):
    def say(what, text):
        subprocess.run(["devpilot-orchestrator", "activity", "--type", what, text], check=True)
    say("thought", f"Reading {issue} ({kind}): {asked}")
    if "long" in asked:  # a long task: the conversation goes on while it works
        for _ in range(1200):
            for note in sorted(Path(os.environ["DEVPILOT_INBOX"]).glob("*.json")):
                heard = json.loads(note.read_text())["prompt"]["body"]
                note.unlink()  # taken in
                print(f"  [agent {os.getpid()}] heard while working: {heard}", flush=True)
                say("thought", f"Noted while working: {heard}")
            time.sleep(0.1)
    say("response", f"Done: {asked}")
"""


class StandInLinear:
    """Linear's GraphQL endpoint, as far as the demo needs it: records each agent activity, and
    answers the rest of what the service sends (the issue's state and delegate, which it reads
    before moving the issue to started; those updates) as a Linear that accepts them."""

    def __init__(self) -> None:
        self.activities: list[dict[str, Any]] = []
        calls = self.activities

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                query = body["query"]
                if "agentActivityCreate" in query or "commentCreate" in query:
                    entity = "agentActivity" if "agentActivityCreate" in query else "comment"
                    calls.append(body["variables"]["input"])
                    key = f"{entity}Create" if entity == "comment" else "agentActivityCreate"
                    answer = {"data": {key: {"success": True, entity: {"id": f"demo-{len(calls)}"}}}}
                elif "issue(id" in query:  # a read: an issue in progress already, with a delegate
                    issue = {"id": body["variables"]["id"], "state": {"id": "s", "type": "started"}}
                    answer = {"data": {"issue": {**issue, "delegate": {"id": "someone"}}}}
                else:  # agentSessionUpdate, issueUpdate: accepted
                    key = "agentSessionUpdate" if "agentSessionUpdate" in query else "issueUpdate"
                    answer = {"data": {key: {"success": True}}}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/graphql"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def said(self, agent_session_id: str) -> list[tuple[str, str]]:
        return [
            (a["content"]["type"], a["content"].get("body", ""))
            for a in self.activities
            if a.get("agentSessionId") == agent_session_id
        ]

    def close(self) -> None:
        self.server.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ok(r: httpx.Response, what: str) -> dict[str, Any]:
    """The answer of a set-up step, which must have worked for the rest to mean anything."""
    if not r.is_success:
        raise RuntimeError(f"demo: {what} failed: {r.status_code} {r.text[:300]}")
    answer: dict[str, Any] = r.json()
    return answer


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
    linear = StandInLinear()
    env["LINEAR_API_URL"] = linear.url
    procs: list[subprocess.Popen[bytes]] = []
    print(f"demo: starting devpilot serve on {url} with an embedded Postgres in {home}")
    try:
        with (home / "serve.log").open("wb") as serve_log:  # shown if the demo fails
            server = subprocess.Popen(
                [sys.executable, "-m", "devpilot", "serve", "--port", str(port)],
                cwd=home,
                env=env,
                stdout=serve_log,
                stderr=subprocess.STDOUT,
            )
        procs.append(server)
        http = httpx.Client(base_url=url, timeout=10)
        _wait(lambda: http.get("/healthz").status_code == 200, 60, "the service")
        print(f"demo: service up after {time.monotonic() - t_begin:.1f}s")

        reg = _ok(
            http.post(
                "/orchestrators",
                headers={"Authorization": f"Bearer {admin}"},
                json={"orgId": "demo-org", "linearUserId": "demo-user", "name": "demo-laptop"},
            ),
            "registering the orchestrator",
        )
        print(f"demo: registered orchestrator {reg['orchestratorId']} for demo-user")
        _ok(  # what an OAuth install stores: the token the service posts to Linear with
            http.post(
                "/linear-credentials",
                headers={"Authorization": f"Bearer {admin}"},
                json={"orgId": "demo-org", "accessToken": "demo-linear-token"},
            ),
            "storing the Linear token",
        )
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
                        "comment": {"id": "demo-comment", "body": "@agent write the release notes"},
                        "sourceCommentId": "demo-comment",
                    },
                    "promptContext": '<issue identifier="DEMO-2"><title>Write the release notes</title></issue>'
                    "\n<comment>@agent write the release notes</comment>",
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
        _conversation(http, secret, linear)
        return 0
    except Exception:
        log = home / "serve.log"
        if log.exists():  # what the service said, before it is cleaned up with the rest
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("demo: devpilot serve's last lines:\n" + "\n".join(tail), file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        linear.close()
        shutil.rmtree(home, ignore_errors=True)
        print(f"demo: cleaned up; {time.monotonic() - t_begin:.1f}s in all")


AGENT_SESSION = "demo-agent-session"


def _prompted(body: str, signal: str | None = None) -> dict[str, Any]:
    activity: dict[str, Any] = {
        "id": secrets.token_hex(8),
        "agentSessionId": AGENT_SESSION,
        "content": {"type": "prompt", "body": body},
        "userId": "demo-user",
    }
    if signal:
        activity["signal"] = signal
    return {
        "type": "AgentSessionEvent",
        "action": "prompted",
        "organizationId": "demo-org",
        "webhookTimestamp": int(time.time() * 1000),
        "agentSession": {"id": AGENT_SESSION, "creatorId": "demo-user"},
        "agentActivity": activity,
    }


def _conversation(http: httpx.Client, secret: str, linear: StandInLinear) -> None:
    """The agent session goes on: a follow-up, a long task, and the user pressing stop in Linear."""

    def send(label: str, event: dict[str, Any]) -> dict[str, Any]:
        body = json.dumps(event).encode()
        r = http.post(
            "/webhook",
            content=body,
            headers={"Linear-Signature": sign(secret, body), "Linear-Delivery": secrets.token_hex(8)},
        )
        answer: dict[str, Any] = r.json()
        print(
            f"demo: webhook '{label}' -> {r.status_code} {answer['status']} {answer.get('kind', '')}".rstrip()
        )
        return answer

    def responses() -> int:
        return [kind for kind, _ in linear.said(AGENT_SESSION)].count("response")

    def said(text: str) -> bool:
        return any(text in body for _, body in linear.said(AGENT_SESSION))

    print("\ndemo: the agent session goes on")
    _wait(lambda: responses() >= 1, 20, "the agent's first response")
    send("long task", _prompted("Now do the long database migration"))
    _wait(lambda: said("(prompt): Now do the long database migration"), 20, "the long task")
    send("follow-up", _prompted("Also mention the new login page"))  # while the agent works
    _wait(lambda: said("Noted while working: Also mention the new login page"), 20, "the running agent")
    send("stop", _prompted("", signal="stop"))
    _wait(lambda: responses() >= 2, 30, "the stop's final response")
    print("\nwhat Linear shows in the agent session on DEMO-2:")
    for kind, text in linear.said(AGENT_SESSION):
        print(f"  [{kind}] {text}")
