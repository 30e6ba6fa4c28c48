"""What the orchestrator says itself in a COMMAND's agent session: its last word when COMMAND did
not say one (`Finished.`, or an `error` with the tail of its stderr), `Stopped` on Linear's stop,
an `error` when its worktree cannot be made.

Linear completes a session on a `response` and shows an `error`; a session left without either
waits for ever. Each is posted with an id made from the message and its purpose: said once, even
when posted again after a restart.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import commands
from orchestrator.backoff import Backoff
from orchestrator.client import Api, Unreachable
from orchestrator.log import Log
from orchestrator.messages import speaks_in
from orchestrator.signals import Signals

ACTIVITY_IDS = uuid.UUID("5b0f7c52-2f7c-4d61-9a55-8c1c2a4e9d10")  # namespace of our own activity ids
FINAL = ("response", "error")  # a conversation's last word: Linear completes the session on it


@dataclass
class LastWord:
    api: Api
    log: Log
    signals: Signals
    backoff: Backoff
    state_dir: Path

    def after_exit(self, m: dict[str, Any], code: int | None, waiting: bool) -> bool:
        """COMMAND ended: when it did not say its own last word, the orchestrator says it, unless
        COMMAND asked the person something (an elicitation: the answer comes as a follow-up) or
        follow-ups it never read are `waiting` (the next COMMAND takes them). `code` is None when
        nothing recorded it (an earlier run's COMMAND whose launcher was killed). True when the
        conversation's last word is said."""
        mid = m["messageId"]
        last = self.said(mid)
        if speaks_in(m) and last not in FINAL:
            if code != 0:
                tail = commands.tail(self.state_dir / "logs" / f"{mid}.stderr")
                how = (
                    "The agent ended, but its exit code is unknown: it was started before the "
                    "orchestrator restarted, and its launcher did not record how it ended."
                    if code is None
                    else f"The agent exited with code {code}."
                )
                self.post(m, {"type": "error", "body": f"{how}{tail}"}, f"{mid}:exit")
                last = "error"
            elif last != "elicitation" and not waiting:
                self.post(m, {"type": "response", "body": "Finished."}, f"{mid}:exit")
                last = "response"
        return last in FINAL

    def said(self, mid: str) -> str | None:
        """The type of the last activity COMMAND posted with `devpilot-orchestrator activity`."""
        try:
            return (self.state_dir / "responded" / mid).read_text().strip() or "response"
        except OSError:
            return None

    def post(self, m: dict[str, Any], content: dict[str, Any], key: str) -> None:
        agent_session_id = speaks_in(m)
        if not agent_session_id:
            return
        # Stable for this message and purpose (said once, even when posted again after a restart),
        # and shaped as the UUID v4 the service takes.
        activity_id = str(uuid.UUID(bytes=uuid.uuid5(ACTIVITY_IDS, key).bytes, version=4))
        for attempt in range(3):
            try:
                status = self.api.activity(agent_session_id, content, activity_id)
                self.log("activity", f"{content['type']} for agent session {agent_session_id}: {status}")
                return
            except Unreachable as exc:
                self.backoff.went_away(str(exc))
                # SIGTERM waits for a last word (`reap`), but not through the backoffs of a service
                # that is away: stopping, this was the last try; and a SIGTERM ends the pause.
                if attempt == 2 or self.signals.stopping:
                    break
                self.signals.pause(self.backoff.next())
        self.log("activity", f"could not post a {content['type']} for agent session {agent_session_id}")
