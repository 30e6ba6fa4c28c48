"""The orchestrator's side of the HTTP contract (httpx; no database access)."""

from __future__ import annotations

from typing import Any, Literal

import httpx

AckResult = Literal["acked", "claim_superseded", "not_found"]


class Unreachable(Exception):
    """The service could not be reached or answered 5xx: retry later, nothing is lost."""


class Rejected(Exception):
    """The service refused our token (401): retrying will not help."""


class Api:
    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> httpx.Response:
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
        r = self._post("/claim", {"max": max, "waitSeconds": wait_seconds}, timeout=wait_seconds + 10.0)
        r.raise_for_status()
        messages: list[dict[str, Any]] = r.json()["messages"]
        return messages

    def ack(self, queue_id: str, claim_token: str) -> AckResult:
        r = self._post("/ack", {"queueId": queue_id, "claimToken": claim_token})
        if r.status_code == 200:
            return "acked"
        code = r.json().get("error")
        if code in ("claim_superseded", "not_found"):
            return code  # type: ignore[no-any-return]
        r.raise_for_status()
        raise Unreachable(f"unexpected ack answer {r.status_code}")

    def realtime_token(self) -> dict[str, Any] | None:
        r = self._post("/realtime-token", {})
        if r.status_code == 404:
            return None
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return body

    def activity(self, agent_session_id: str, content: dict[str, Any], activity_id: str) -> str:
        """Post an activity to the agent session (202 queued); returns the status or the error code.
        The id makes a retried post (after a timeout, or a restart) one activity in Linear."""
        r = self._post(
            "/activities", {"agentSessionId": agent_session_id, "content": content, "id": activity_id}
        )
        if r.status_code == 202:
            return "queued"
        return str(r.json().get("error", r.status_code))

    def close(self) -> None:
        self._http.close()
