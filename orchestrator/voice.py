"""How a COMMAND speaks in its agent session: activities and the plan, posted through the service
with the token scoped to that agent session that the orchestrator put in COMMAND's environment
(never the machine's). Used by `devpilot-orchestrator activity` and `plan`, and by the agent
runners (`orchestrator.runners`).

Each activity posted is noted where the orchestrator reads COMMAND's last word
(`DEVPILOT_RESPONDED_FILE`: after a `response` or an `elicitation` it adds no "Finished." of its
own) and appended to the conversation's transcript (`DEVPILOT_TRANSCRIPT`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.client import Api, Unreachable
from orchestrator.conversations import append_line

NEEDS = {
    "activity": ("DEVPILOT_ACTIVITIES_URL", "DEVPILOT_AGENT_TOKEN", "DEVPILOT_AGENT_SESSION_ID"),
    "plan": ("DEVPILOT_PLAN_URL", "DEVPILOT_AGENT_TOKEN", "DEVPILOT_AGENT_SESSION_ID"),
}


def missing(environ: Mapping[str, str], what: str) -> list[str]:
    """The variables `what` (activity, plan) needs that this environment lacks: a process the
    orchestrator did not start, or a message with no agent session to speak in."""
    return [k for k in NEEDS[what] if not environ.get(k)]


class Voice:
    def __init__(self, environ: Mapping[str, str], retries: int = 0) -> None:
        """`retries`: how often a post the service did not answer is tried again (with the same id,
        so it shows once), with backoff; 0 for a one-shot command."""
        self.agent_session = environ.get("DEVPILOT_AGENT_SESSION_ID", "")
        endpoints = {
            name: environ[var]
            for name, var in (("activities", "DEVPILOT_ACTIVITIES_URL"), ("plan", "DEVPILOT_PLAN_URL"))
            if environ.get(var)
        }
        self._api = Api(None, environ.get("DEVPILOT_AGENT_TOKEN", ""), endpoints=endpoints)
        self._responded = environ.get("DEVPILOT_RESPONDED_FILE")
        self._transcript = environ.get("DEVPILOT_TRANSCRIPT")
        self._retries = retries

    def say(
        self,
        content: dict[str, Any],
        activity_id: str | None = None,
        signal: str | None = None,
        signal_metadata: dict[str, Any] | None = None,
        ephemeral: bool = False,
    ) -> str:
        """Post an activity: `queued`, or the service's refusal. Raises Unreachable (after the
        retries) and Rejected (the token)."""
        the_id = activity_id or str(uuid.uuid4())
        status = self._tried(
            lambda: self._api.activity(
                self.agent_session,
                content,
                the_id,
                signal=signal,
                signal_metadata=signal_metadata,
                ephemeral=ephemeral,
            )
        )
        if status == "queued":
            self._noted(content, signal, signal_metadata)
        return status

    def plan(self, steps: list[dict[str, str]]) -> str:
        """Replace the agent session's plan: `queued`, or the service's refusal."""
        return self._tried(lambda: self._api.plan(self.agent_session, steps))

    def close(self) -> None:
        self._api.close()

    def _tried(self, post: Any) -> str:
        for attempt in range(self._retries + 1):
            try:
                return str(post())
            except Unreachable:
                if attempt == self._retries:
                    raise
                time.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")  # (the loop returns or raises)

    def _noted(self, content: dict[str, Any], signal: str | None, metadata: dict[str, Any] | None) -> None:
        if self._responded:  # the last thing COMMAND said: after a response or an elicitation, no "Finished."
            fd = os.open(self._responded, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
            os.write(fd, content["type"].encode())
            os.close(fd)
        if self._transcript:
            entry: dict[str, Any] = {"at": datetime.now(UTC).isoformat(), "from": "agent", "kind": "activity"}
            entry.update(content)
            if signal:
                entry.update(signal=signal, signalMetadata=metadata or {})
            append_line(Path(self._transcript), entry)
