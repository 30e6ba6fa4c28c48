"""The orchestrator's side of the HTTP contract (httpx; no database access)."""

from __future__ import annotations

from typing import Any, Literal

import httpx

AckResult = Literal["acked", "claim_superseded", "not_found"]


class Unreachable(Exception):
    """The service could not be reached or answered 5xx: retry later, nothing is lost."""


class Rejected(Exception):
    """The service refused our token (401): retrying will not help."""


# Route name (as in the endpoints map deploy.sh prints) -> path under one base URL.
ROUTES = {
    "claim": "/claim",
    "ack": "/ack",
    "release": "/release",
    "activities": "/activities",
    "realtimeToken": "/realtime-token",
    "plan": "/plan",
    "machine": "/machine",
}


def endpoints_for(url: str | None, endpoints: dict[str, str] | None) -> dict[str, str]:
    """Where each route is: one base URL serving every route (`devpilot serve`, the `api` target),
    or a map of each route's own URL (a cloud deploy, one function per route)."""
    if endpoints:
        return {name: endpoints[name] for name in ROUTES if isinstance(endpoints.get(name), str)}
    if not url:
        raise ValueError("give a base URL or an endpoints map")
    return {name: url.rstrip("/") + path for name, path in ROUTES.items()}


class Api:
    def __init__(
        self, url: str | None, token: str, timeout: float = 10.0, endpoints: dict[str, str] | None = None
    ) -> None:
        self.endpoints = endpoints_for(url, endpoints)
        self.url = url.rstrip("/") if url else ""
        self._http = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=timeout)

    def _post(self, route: str, body: dict[str, Any], timeout: float | None = None) -> httpx.Response:
        if route not in self.endpoints:
            raise Rejected(f"no URL for the {route} route in the endpoints map")
        path = self.endpoints[route]
        try:
            r = self._http.post(path, json=body, timeout=timeout or self._http.timeout)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        if r.status_code >= 500:
            raise Unreachable(f"HTTP {r.status_code} from {path}")
        if r.status_code == 401:
            raise Rejected(r.json().get("detail", "unauthorized"))
        return r

    def claim(self, max: int, wait_seconds: int = 0) -> list[dict[str, Any]]:
        r = self._post("claim", {"max": max, "waitSeconds": wait_seconds}, timeout=wait_seconds + 10.0)
        r.raise_for_status()
        messages: list[dict[str, Any]] = r.json()["messages"]
        return messages

    def ack(self, queue_id: str, claim_token: str) -> AckResult:
        r = self._post("ack", {"queueId": queue_id, "claimToken": claim_token})
        if r.status_code == 200:
            return "acked"
        code = r.json().get("error")
        if code in ("claim_superseded", "not_found"):
            return code  # type: ignore[no-any-return]
        r.raise_for_status()
        raise Unreachable(f"unexpected ack answer {r.status_code}")

    def release(self, queue_id: str, claim_token: str, reason: str) -> str:
        """Give a claimed message back now, with the reason: `released`, or the error code."""
        r = self._post("release", {"queueId": queue_id, "claimToken": claim_token, "reason": reason})
        if r.status_code == 200:
            return "released"
        return str(r.json().get("error", r.status_code))

    def machine(self, repositories: list[dict[str, str]], labels: list[str]) -> dict[str, Any] | None:
        """Say what this machine has (`POST /machine`); it replaces what it said before. The
        service's answer, or its refusal; None: the service has no such route (an older version),
        or the endpoints map names none."""
        if "machine" not in self.endpoints:
            return None
        r = self._post("machine", {"repositories": repositories, "labels": labels})
        if r.status_code == 404:
            return None
        body: dict[str, Any] = r.json()
        return body  # (a refusal: {"error", "detail"})

    def realtime_token(self) -> dict[str, Any] | None:
        r = self._post("realtimeToken", {})
        if r.status_code == 404:
            return None
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def activity(
        self,
        agent_session_id: str,
        content: dict[str, Any],
        activity_id: str,
        signal: str | None = None,
        signal_metadata: dict[str, Any] | None = None,
        ephemeral: bool = False,
    ) -> str:
        """Post an activity to the agent session (202 queued); returns the status or the error code.
        The id makes a retried post (after a timeout, or a restart) one activity in Linear. An
        elicitation may carry Linear's `select` or `auth` signal with its metadata; an `ephemeral`
        one is replaced in Linear by the next."""
        body: dict[str, Any] = {"agentSessionId": agent_session_id, "content": content, "id": activity_id}
        if signal is not None:
            body.update(signal=signal, signalMetadata=signal_metadata or {})
        if ephemeral:
            body["ephemeral"] = True
        r = self._post("activities", body)
        if r.status_code == 202:
            return "queued"
        return str(r.json().get("error", r.status_code))

    def plan(self, agent_session_id: str, steps: list[dict[str, str]]) -> str:
        """Replace the agent session's plan in Linear (202 queued); returns the status or the error code."""
        r = self._post("plan", {"agentSessionId": agent_session_id, "plan": steps})
        if r.status_code == 202:
            return "queued"
        body = r.json()
        return f"{body.get('error', r.status_code)}: {body.get('detail', '')}"

    def activities(self, agent_session_id: str) -> list[dict[str, Any]]:
        """The agent session's activities in order, the service's and the agent's (for the transcript)."""
        if "activities" not in self.endpoints:
            raise Rejected("no URL for the activities route in the endpoints map")
        try:
            r = self._http.get(self.endpoints["activities"], params={"agentSessionId": agent_session_id})
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        if r.status_code >= 500:
            raise Unreachable(f"HTTP {r.status_code} from {self.endpoints['activities']}")
        if r.status_code != 200:
            raise Rejected(f"HTTP {r.status_code}: {r.json().get('error', '')}")
        activities: list[dict[str, Any]] = r.json()["activities"]
        return activities

    def close(self) -> None:
        self._http.close()
