"""`devpilot demo`: the whole loop on an embedded database in a few seconds, headless.

Starts a local stand-in for Linear (its GraphQL API, OAuth authorize, token and revoke endpoints)
and `devpilot serve` (embedded Postgres in a temporary folder); installs the app in the workspace
(OAuth, actor=app); connects a machine the way an engineer does, with `devpilot-orchestrator login
--no-browser` (the demo types the code on the service's page, signs in to the stand-in Linear and
presses Register, as a person would in a browser); runs `devpilot-orchestrator` with the token the
login stored and a sample agent command; sends signed sample Linear webhooks (an assignment, then a
whole agent conversation: created, a long task, a follow-up that reaches the agent while it
works, and Linear's stop); prints the timeline
from webhook to agent start and what Linear would show in the agent session; and cleans up.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
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
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx

from devpilot.demo_events import prompted
from shared.linear.webhooks import sign

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


ORG = {"id": "demo-org", "name": "Demo Workspace", "urlKey": "demo"}
PERSON = {
    "id": "demo-user",
    "name": "Dana Demo",
    "active": True,
    "guest": False,
    "app": False,
    "organization": ORG,
}


class StandInLinear:
    """Linear, as far as the demo needs it: the OAuth authorize page (a browser already signed in as
    Dana Demo, who presses Authorize), the token endpoint (with PKCE for a person's sign-in), token
    revocation, and GraphQL: the workspace and the app user at install, `viewer`, each agent
    activity (recorded), and the rest of what the service sends (the issue's state and delegate,
    read before it moves the issue to started; those updates) as a Linear that accepts them."""

    def __init__(self) -> None:
        self.activities: list[dict[str, Any]] = []
        self.plans: list[list[dict[str, str]]] = []  # each agent session plan posted
        calls, plans = self.activities, self.plans
        grants: dict[str, dict[str, str]] = {}

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict[str, Any] | None = None, location: str = "") -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # /oauth/authorize
                q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                code = f"code-{len(grants) + 1}"
                grants[code] = q
                self._send(
                    302, location=f"{q['redirect_uri']}?{urlencode({'code': code, 'state': q['state']})}"
                )

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                path = urlsplit(self.path).path
                if path == "/oauth/revoke":
                    return self._send(200)
                if path == "/oauth/token":
                    form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                    grant = grants.pop(form.get("code", ""), None)
                    if grant is None:
                        return self._send(400, {"error": "invalid_grant"})
                    if grant.get("actor") == "user":  # a person: PKCE S256, as Linear checks it
                        digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
                        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != grant.get(
                            "code_challenge"
                        ):
                            return self._send(400, {"error": "invalid_grant"})
                        person_token = {"access_token": "demo-person-token", "token_type": "Bearer"}  # nosec B105
                        return self._send(200, person_token)
                    return self._send(
                        200,
                        {
                            "access_token": "demo-app-token",  # (the stand-in's)  # nosec B105
                            "refresh_token": "demo-refresh",  # nosec B105
                            "expires_in": 86_400,
                        },
                    )
                body = json.loads(raw)
                query = body["query"]
                if "DevpilotOrganization" in query:  # the install: the workspace and the app user
                    return self._send(200, {"data": {"organization": ORG, "viewer": {"id": "demo-app-user"}}})
                if "viewer" in query:  # a person's sign-in
                    return self._send(200, {"data": {"viewer": PERSON}})
                if "agentActivityCreate" in query or "commentCreate" in query:
                    entity = "agentActivity" if "agentActivityCreate" in query else "comment"
                    calls.append(body["variables"]["input"])
                    key = f"{entity}Create" if entity == "comment" else "agentActivityCreate"
                    return self._send(
                        200, {"data": {key: {"success": True, entity: {"id": f"demo-{len(calls)}"}}}}
                    )
                if "issue(id" in query:  # a read: an issue in progress already, with a delegate
                    issue = {"id": body["variables"]["id"], "state": {"id": "s", "type": "started"}}
                    return self._send(200, {"data": {"issue": {**issue, "delegate": {"id": "someone"}}}})
                key = "agentSessionUpdate" if "agentSessionUpdate" in query else "issueUpdate"
                if key == "agentSessionUpdate" and "plan" in body["variables"].get("input", {}):
                    plans.append(body["variables"]["input"]["plan"])
                self._send(200, {"data": {key: {"success": True}}})  # (those updates: accepted)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/graphql"
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


class Browser:
    """A person's browser, in a few lines: follows redirects and keeps cookies (a browser keeps a
    Secure cookie for http://127.0.0.1, which httpx would drop)."""

    def __init__(self) -> None:
        self.http = httpx.Client(timeout=10)
        self.cookies: dict[str, str] = {}

    def go(self, url: str, method: str = "GET", data: dict[str, str] | None = None) -> httpx.Response:
        while True:
            cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            r = self.http.request(method, url, data=data, headers={"Cookie": cookie} if cookie else {})
            for header in r.headers.get_list("set-cookie"):
                name, _, rest = header.partition("=")
                value = rest.split(";", 1)[0]
                if "max-age=0" in header.lower() or not value:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = value
            if not r.is_redirect:
                return r
            url, method, data = urljoin(str(r.url), r.headers["Location"]), "GET", None


def _install(url: str) -> None:
    """The workspace's admin installs the agent (OAuth, actor=app) in their browser."""
    page = Browser().go(f"{url}/oauth/install")
    if page.status_code != 200:
        raise RuntimeError(f"demo: installing the app failed: {page.status_code} {page.text[:300]}")
    print(
        f"demo: installed the agent in Linear's {ORG['name']} (GET /oauth/install, as the workspace's admin)"
    )


def _login(url: str, home: Path, env: dict[str, str]) -> None:
    """An engineer connects their machine, headless: `login --no-browser`, then the code typed on
    the service's page, a sign-in to Linear and Register, in a browser elsewhere."""
    command = ["devpilot-orchestrator", "login", "--url", url, "--name", "demo-laptop", "--no-browser"]
    print(f"\ndemo: $ {' '.join(command)}")
    login = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *command[1:], "--state-dir", str(home / "state")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert login.stdout is not None
    page_line, code_line = login.stdout.readline().rstrip(), login.stdout.readline().rstrip()
    print(f"  {page_line}\n  {code_line}")
    code = code_line.rsplit(" ", 1)[-1]
    browser = Browser()
    confirm = browser.go(page_line.rsplit(" ", 1)[-1], "POST", {"code": code})
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    done = browser.go(f"{url}/enroll/confirm", "POST", {**fields, "decision": "register"})
    if done.status_code != 200:
        raise RuntimeError(f"demo: confirming the machine failed: {done.status_code} {done.text[:300]}")
    print(f"demo: (in a browser) typed {code} at {page_line.rsplit(' ', 1)[-1]}, signed in to Linear as")
    print(f"      {PERSON['name']}, and pressed Register on the page naming demo-laptop and {ORG['name']}")
    out, _ = login.communicate(timeout=30)
    if login.returncode != 0:
        raise RuntimeError("demo: login failed")
    print(f"  {out.strip()}")


def run_demo(agent: str | None = None) -> int:
    """The demo; with `agent` ("claude", "codex"), that agent's real CLI works on an issue after
    the login, instead of the sample agent (devpilot.demo_agent)."""
    if agent:
        from devpilot import demo_agent

        how = demo_agent.missing(agent)
        if how is not None:
            print(how)
            return 1
    t_begin = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="devpilot-demo-"))
    secret = secrets.token_urlsafe(16)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DATABASE_LISTEN_URL")}
    linear = StandInLinear()
    env.update(
        {
            "DEVPILOT_HOME": str(home / ".devpilot"),
            "LINEAR_WEBHOOK_SECRET": secret,
            "DEVPILOT_PUBLIC_URL": url,
            "LINEAR_CLIENT_ID": "demo-client",
            "LINEAR_CLIENT_SECRET": "demo-client-secret",  # (the stand-in's; not a secret)  # nosec B105
            "LINEAR_API_URL": linear.url,
            "LINEAR_OAUTH_AUTHORIZE_URL": f"{linear.base}/oauth/authorize",
            "LINEAR_OAUTH_TOKEN_URL": f"{linear.base}/oauth/token",
            "LINEAR_OAUTH_REVOKE_URL": f"{linear.base}/oauth/revoke",
        }
    )
    env.pop("DEVPILOT_ORCHESTRATOR_TOKEN", None)
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

        _install(url)
        _login(url, home, env)
        if agent:
            demo_agent.run(agent, http, secret, linear.activities, linear.plans, home, env, _wait)
            return 0
        started_file = home / "started.jsonl"
        started_file.touch()
        print(
            "\ndemo: $ devpilot-orchestrator --transport listen -- <sample agent>  (URL and token from the login)"
        )
        orch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
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
        print("\ndemo: $ devpilot-orchestrator machines")
        machines = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "machines", "--state-dir", str(home / "state")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        print("\n".join(f"  {line}" for line in machines.stdout.splitlines()))
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
    send("long task", prompted("Now do the long database migration", AGENT_SESSION))
    _wait(lambda: said("(prompt): Now do the long database migration"), 20, "the long task")
    send("follow-up", prompted("Also mention the new login page", AGENT_SESSION))  # while the agent works
    _wait(lambda: said("Noted while working: Also mention the new login page"), 20, "the running agent")
    send("stop", prompted("", AGENT_SESSION, signal="stop"))
    _wait(lambda: responses() >= 2, 30, "the stop's final response")
    print("\nwhat Linear shows in the agent session on DEMO-2:")
    for kind, text in linear.said(AGENT_SESSION):
        print(f"  [{kind}] {text}")
