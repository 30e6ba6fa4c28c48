"""A speaker for the runners' narrator that records what would be posted to Linear, in order:
the mapping's tests replay an agent's recorded stream through it. It is the orchestrator's own
`Voice`; only the HTTP under it is a recorder (each body kept, answered 202), so what is recorded
is what the service would be sent."""

from __future__ import annotations

import json
from typing import Any

import httpx

from orchestrator.voice import Voice

ENVIRON = {
    "DEVPILOT_ACTIVITIES_URL": "http://heard.invalid/activities",
    "DEVPILOT_PLAN_URL": "http://heard.invalid/plan",
    "DEVPILOT_AGENT_SESSION_ID": "heard",
    "DEVPILOT_AGENT_TOKEN": "heard",
}


class Heard(Voice):
    """What the narrator would post to Linear, in order: each post's body but for the agent
    session and the activity's id (`content` with `signal`, `signalMetadata`, `ephemeral` when
    set; or `plan`)."""

    def __init__(self) -> None:
        super().__init__(ENVIRON)
        self.posts: list[dict[str, Any]] = []
        self._api._http.close()
        self._api._http = httpx.Client(transport=httpx.MockTransport(self._heard))

    def _heard(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.posts.append({k: v for k, v in body.items() if k not in ("agentSessionId", "id")})
        return httpx.Response(202, json={"status": "queued"})

    def shown(self) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for p in self.posts:
            if "plan" in p:
                out.append(("plan", json.dumps(p["plan"])))
                continue
            c = p["content"]
            if c["type"] == "action":
                out.append(("action", c["action"], c["parameter"], c.get("result", "")))
            else:
                out.append((c["type"], c["body"]))
        return out
