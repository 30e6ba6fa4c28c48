"""The agent's own state, kept across the COMMANDs of one conversation: its session (or thread)
id, so the next COMMAND resumes the same session (`claude --resume`), and what the runner must
remember with it (the to-do list Linear shows as the plan).

It lives in the conversation's folder in the orchestrator's state directory (the folder that
holds `DEVPILOT_INBOX` and `DEVPILOT_TRANSCRIPT`: private, mode 0700, removed with the
conversation by housekeeping), never in the working directory: that is the repository the agent
edits, and with several conversations on one checkout it is shared. Written whole and renamed
into place, so a runner killed mid-write leaves the previous state, never half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def conversation_folder(environ: Mapping[str, str]) -> Path | None:
    """The conversation's folder: the inbox's parent. None when not run by an orchestrator."""
    inbox = environ.get("DEVPILOT_INBOX")
    return Path(inbox).parent if inbox else None


class Store:
    def __init__(self, folder: Path | None, agent: str) -> None:
        self.path = folder / f"agent-{agent}.json" if folder is not None else None

    def load(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def save(self, state: dict[str, Any]) -> None:
        if self.path is None:
            return
        staged = self.path.with_name(f".{self.path.name}")
        fd = os.open(staged, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(state))
            f.flush()
            os.fsync(f.fileno())
        os.replace(staged, self.path)
