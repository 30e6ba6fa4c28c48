"""A speaker for the runners' narrator that records what would be posted to Linear, in order:
the mapping's tests replay an agent's recorded stream through it."""

from __future__ import annotations

import json
from typing import Any


class Heard:
    """What the narrator would post to Linear, in order."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []

    def say(
        self,
        content: dict[str, Any],
        activity_id: str | None = None,
        signal: str | None = None,
        signal_metadata: dict[str, Any] | None = None,
        ephemeral: bool = False,
    ) -> str:
        self.posts.append(
            {"content": content, "signal": signal, "meta": signal_metadata, "ephemeral": ephemeral}
        )
        return "queued"

    def plan(self, steps: list[dict[str, str]]) -> str:
        self.posts.append({"plan": steps})
        return "queued"

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
