"""A real server for HTTP tests: the real app on a real socket (werkzeug threaded), per test DB."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from werkzeug.serving import make_server

from devpilot.serve import QuietHandler
from functions import runtime
from functions.app import wsgi
from shared.delivery.wakeups import Wakeups
from shared.linear.webhooks import sign
from shared.plumbing.db import Pool
from shared.plumbing.embedded import Database
from shared.plumbing.settings import Settings

ADMIN = "admin-token-for-tests"
SECRET = "linear-signing-secret-for-tests"


@dataclass
class Api:
    url: str
    settings: Settings
    pool: Pool
    http: httpx.Client
    served: Served | None = None
    _counter: list[int] = field(default_factory=lambda: [0])

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN}"}

    def register(self, org: str = "org-a", user: str = "user-1", name: str = "laptop") -> tuple[str, str]:
        r = self.http.post(
            "/orchestrators", json={"orgId": org, "linearUserId": user, "name": name}, headers=self.admin()
        )
        assert r.status_code == 201, r.text
        return r.json()["orchestratorId"], r.json()["token"]

    def post_as(self, token: str, path: str, body: Any = None) -> httpx.Response:
        return self.http.post(
            path, json=body if body is not None else {}, headers={"Authorization": f"Bearer {token}"}
        )

    def claim_all(self, token: str) -> list[dict[str, Any]]:
        """What the machine of `token` claims now (up to 100 messages); the claim must answer 200."""
        r = self.post_as(token, "/claim", {"max": 100})
        assert r.status_code == 200, r.text
        messages: list[dict[str, Any]] = r.json()["messages"]
        return messages

    def webhook(
        self,
        payload: dict[str, Any],
        delivery: str | None = "auto",
        secret: str = SECRET,
        raw: bytes | None = None,
    ) -> httpx.Response:
        body = raw if raw is not None else json.dumps(payload).encode()
        headers = {"Linear-Signature": sign(secret, body), "Content-Type": "application/json"}
        if delivery == "auto":
            self._counter[0] += 1
            delivery = f"delivery-{time.time_ns()}-{self._counter[0]}"
        if delivery is not None:
            headers["Linear-Delivery"] = delivery
        return self.http.post("/webhook", content=body, headers=headers)


_changes = itertools.count()
_last_change = [0]
_changes_lock = threading.Lock()


def _updated_at() -> str:
    """A distinct `updatedAt` per made-up change, as Linear's are (the content half of a delivery's
    identity), and later than every one made before it in this process, as one issue's changes are
    (the order of its assignment events): now in milliseconds, or the last one's plus one."""
    with _changes_lock:
        ms = _last_change[0] = max(time.time_ns() // 1_000_000, _last_change[0] + 1)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def now_ms() -> int:
    return int(time.time() * 1000)


def issue_event(
    action: str = "create",
    *,
    org: str = "org-a",
    issue_id: str = "issue-1",
    assignee: str | None = "user-1",
    updated_from: dict[str, Any] | None = None,
    ts: int | None = None,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": issue_id,
        "identifier": "ENG-42",
        "title": "Fix the flaky test",
        "url": f"https://linear.app/acme/issue/{issue_id}",
        "description": "It fails on Tuesdays.",
        "assigneeId": assignee,
        "updatedAt": _updated_at(),
    }
    event: dict[str, Any] = {
        "type": "Issue",
        "action": action,
        "organizationId": org,
        "webhookTimestamp": ts if ts is not None else now_ms(),
        "data": data,
    }
    if updated_from is not None:
        event["updatedFrom"] = updated_from
    return event


def app_revoked_event(org: str = "org-a", client: str = "client-id") -> dict[str, Any]:
    """Linear's `OAuthApp revoked`: the app of OAuth client `client` uninstalled from `org`."""
    return {
        "type": "OAuthApp",
        "action": "revoked",
        "organizationId": org,
        "oauthClientId": client,
        "createdAt": _updated_at(),
        "webhookId": "webhook-1",
        "webhookTimestamp": now_ms(),
    }


ROOT_PLACEHOLDER = "This thread is for an agent session with devpilot."  # Linear's, for a delegation


def agent_session_event(
    *,
    org: str = "org-a",
    creator: str | None = "user-1",
    session_id: str = "as-1",
    action: str = "created",
    body: str | None = None,
    signal: str | None = None,
    signal_metadata: dict[str, Any] | None = None,
    issue_id: str = "issue-as",
    in_reply_to: str | None = None,
) -> dict[str, Any]:
    """An AgentSessionEvent shaped as Linear's AgentSessionEventWebhookPayload (checked against the
    schema in tests/unit/test_linear_schema.py).

    `created`: with `body`, a mention of the agent in a comment that says it (the session's source
    comment; with `in_reply_to`, a reply in the thread whose root comment is someone else's words
    `in_reply_to`); without, a delegation, whose root comment is Linear's placeholder. Linear's
    `promptContext` holds the issue and the request. The issue carries no assignee: Linear's
    webhook issue object has none. `prompted`: a follow-up `body`, or a `signal` (stop, select, ...)."""
    session: dict[str, Any] = {
        "id": session_id,
        "appUserId": "app-user",
        "creatorId": creator,
        "organizationId": org,
        "status": "pending",
        "type": "commentThread",
        "createdAt": "2026-12-02T10:00:00.000Z",
        "updatedAt": _updated_at(),
        "url": f"https://linear.app/acme/agent-session/{session_id}",
        "issueId": issue_id,
        "issue": {
            "id": issue_id,
            "identifier": "ENG-7",
            "title": "Agent task",
            "url": "https://linear.app/acme/issue/ENG-7",
            "description": "Do it",
            "teamId": "team-eng",
            "team": {"id": "team-eng", "key": "ENG", "name": "Engineering"},
        },
    }
    previous: list[dict[str, Any]] = []
    if action == "created" and body and in_reply_to is not None:
        session["comment"] = {"id": f"root-{session_id}", "body": in_reply_to, "issueId": issue_id}
        previous = [{"id": f"c-{session_id}", "body": body, "issueId": issue_id, "userId": creator}]
        session["sourceCommentId"] = f"c-{session_id}"
    elif action == "created" and body:
        session["comment"] = {"id": f"c-{session_id}", "body": body, "issueId": issue_id, "userId": creator}
        session["sourceCommentId"] = f"c-{session_id}"
    else:
        session["comment"] = {"id": f"root-{session_id}", "body": ROOT_PLACEHOLDER, "issueId": issue_id}
    session["commentId"] = session["comment"]["id"]
    event: dict[str, Any] = {
        "type": "AgentSessionEvent",
        "action": action,
        "organizationId": org,
        "webhookId": "webhook-app",
        "webhookTimestamp": now_ms(),
        "createdAt": "2026-12-02T10:00:00.000Z",
        "appUserId": "app-user",
        "oauthClientId": "oauth-client",
        "agentSession": session,
    }
    if action == "created":
        request = f"\n<comment>{body}</comment>" if body else ""
        event["promptContext"] = f'<issue identifier="ENG-7"><title>Agent task</title></issue>{request}'
        event["guidance"] = [
            {
                "body": "Run the tests before you answer.",
                "origin": {"type": "Team", "team": {"id": "team-eng", "name": "Engineering"}},
            }
        ]
        event["previousComments"] = previous
    else:
        activity: dict[str, Any] = {
            "id": f"act-{time.time_ns()}-{next(_changes)}",
            "agentSessionId": session_id,
            "content": {"type": "prompt", "body": body or ""},
            "userId": creator or "someone",
            "user": {
                "id": creator or "someone",
                "name": "Someone",
                "email": "someone@example.com",
                "url": "https://linear.app/acme/profiles/someone",
            },
            # (when the person wrote it: later than every change made before it, as Linear's are)
            "createdAt": (written := _updated_at()),
            "updatedAt": written,
        }
        if signal:
            activity["signal"] = signal
        if signal_metadata is not None:
            activity["signalMetadata"] = signal_metadata
        event["agentActivity"] = activity
    return event


class Served:
    def __init__(self, db_url: str, settings: Settings, pool: Pool) -> None:
        self.wakeups = Wakeups(db_url)
        self.runtime = runtime.Runtime(settings, Database(db_url, embedded=False), pool, self.wakeups)
        runtime.install(self.runtime)
        self.runtime.health.start()  # (as `devpilot serve` does: ready before the first probe)
        self.server = make_server("127.0.0.1", 0, wsgi, threaded=True, request_handler=QuietHandler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.wakeups.stop()
        self.runtime.health.close()
        runtime.install(None)
