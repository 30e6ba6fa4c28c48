"""What a claimed message says, as the orchestrator reads it (the wire form of the contract's
`TaskDispatchMessage`)."""

from __future__ import annotations

import uuid
from typing import Any


def name(m: dict[str, Any]) -> str:
    """How the logs name it: its issue's identifier, else its id."""
    return str((m.get("issue") or {}).get("identifier") or m["messageId"])


def request_text(m: dict[str, Any]) -> str:
    """What COMMAND is asked (`DEVPILOT_PROMPT`): on a follow-up, the person's message; on an agent
    session's start, Linear's promptContext (the issue, the thread, the guidance); on a plain
    assignment, the issue itself."""
    prompt = m.get("prompt") or {}
    if m.get("kind") != "start":
        return str(prompt.get("body") or "")
    if prompt.get("context"):
        return str(prompt["context"])
    issue = m.get("issue") or {}
    head = ": ".join(str(x) for x in (issue.get("identifier"), issue.get("title")) if x)
    return "\n\n".join(
        x for x in (head, str(issue.get("description") or ""), str(prompt.get("body") or "")) if x
    )


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
