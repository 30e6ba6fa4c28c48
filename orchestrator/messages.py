"""What a claimed message says, as the orchestrator reads it (the wire form of the contract's
`TaskDispatchMessage`)."""

from __future__ import annotations

import uuid
from typing import Any

from shared.wire.messages import IssueRef, start_request


def name(m: dict[str, Any]) -> str:
    """How the logs name it: its issue's identifier, else its id."""
    return str((m.get("issue") or {}).get("identifier") or m["messageId"])


def request_text(m: dict[str, Any]) -> str:
    """What COMMAND is asked (`DEVPILOT_PROMPT`), the same as its stdin's: on a follow-up, the
    person's message (`prompt.body`); on a start, `prompt.context` (Linear's promptContext: the
    issue, the thread, the guidance; a plain assignment's, the issue itself). A start from a
    service older than that has no context: the same text is made here (`start_request`)."""
    prompt = m.get("prompt") or {}
    if m.get("kind") != "start":
        return str(prompt.get("body") or "")
    if prompt.get("context"):
        return str(prompt["context"])
    issue = IssueRef.from_wire(m.get("issue") or {"id": ""})
    return start_request(issue, str(prompt.get("body") or "") or None)


def speaks_in(m: dict[str, Any]) -> str | None:
    """Where the agent's replies to this message go: its agent session, or, for a plain assignment
    (a start without one), `devpilot:<sessionId>`, the agent session the service opens in Linear
    for it once delivered (the service holds the replies until Linear has named it)."""
    agent = m.get("agentSessionId")
    if agent:
        return str(agent)
    return f"devpilot:{m['sessionId']}" if m.get("kind", "start") == "start" and m.get("sessionId") else None


def is_uuid(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False
