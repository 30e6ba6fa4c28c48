"""The follow-ups that arrive while the agent works (`DEVPILOT_INBOX`): one JSON file each, the
message as COMMAND's stdin has it, named so they sort in arrival order. The runner hands each to
the agent, then removes it (taken in); what it leaves there when it ends, the orchestrator gives
the next COMMAND."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


class Inbox:
    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def oldest(self) -> tuple[Path, dict[str, Any]] | None:
        """The oldest follow-up waiting, and its message (a file that is not a message is set aside)."""
        if self.folder is None:
            return None
        for path in sorted(self.folder.glob("*.json")):
            try:
                message = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".unreadable"))
                continue
            if isinstance(message, dict):
                return path, message
        return None

    def waiting(self) -> bool:
        return self.oldest() is not None

    @staticmethod
    def taken(path: Path) -> None:
        """The agent has it: out of the inbox."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
