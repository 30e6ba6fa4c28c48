"""The webhooks the demos send as Linear would, beyond the one that starts each: a person's message
in an agent session (`devpilot.demo`, `devpilot.demo_agent`)."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any


def prompted(body: str, session: str, signal: str | None = None) -> dict[str, Any]:
    """A person's message in the agent session (`signal="stop"`: the stop button), as Linear's
    `prompted` webhook carries it."""
    activity: dict[str, Any] = {
        "id": secrets.token_hex(8),
        "agentSessionId": session,
        "content": {"type": "prompt", "body": body},
        "userId": "demo-user",
        "createdAt": datetime.now(UTC).isoformat(timespec="milliseconds"),
    }
    if signal:
        activity["signal"] = signal
    return {
        "type": "AgentSessionEvent",
        "action": "prompted",
        "organizationId": "demo-org",
        "webhookTimestamp": int(time.time() * 1000),
        "agentSession": {"id": session, "creatorId": "demo-user"},
        "agentActivity": activity,
    }
