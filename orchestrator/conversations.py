"""A conversation on this machine: one Linear agent session (or one plain assignment), its inbox,
its transcript and its working directory, kept in the state directory.

- **Inbox** (`DEVPILOT_INBOX`): every message of the conversation but a stop is written here, one
  file each, before it is acked. While the conversation's COMMAND runs, a follow-up that arrives
  appears in it: an agent that reads its inbox (and removes each file it has taken in) keeps the
  conversation live. When no COMMAND runs, the oldest file is the next COMMAND's message. File
  names sort in arrival order (`<nanoseconds>-<messageId>.json`); each is written whole and then
  renamed into place, so a reader never sees half of one.
- **Written once, whatever happens**: the write first makes `inboxed/<messageId>`, a hard link to
  the finished file, then renames the file into the inbox. A redelivery of the message, or the
  orchestrator's restart after a SIGKILL anywhere in between, finds the link and does not write it
  again (finishing the rename if that was what was interrupted): a follow-up the agent already
  read and removed is never handed to it a second time.
- **Transcript** (`DEVPILOT_TRANSCRIPT`): JSON lines, in order, of every message of the
  conversation this machine has had and every activity posted in it, the service's and the
  agent's. Made anew before each COMMAND starts (the messages from the journal, the activities
  from the service), and appended to while it runs (each new message; each activity the agent
  posts with `devpilot-orchestrator activity`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orchestrator.state import private_dir

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")


def conversation_key(message: dict[str, Any]) -> str:
    """An agent session's messages are one conversation; a plain assignment is one of its own, and
    the follow-ups and stop of the agent session devpilot opened for it (named `devpilot:<its
    sessionId>` in their messages) belong to it."""
    agent = str(message.get("agentSessionId") or "")
    if agent.startswith("devpilot:"):
        return agent.removeprefix("devpilot:")
    return agent or str(message["sessionId"])


@dataclass(frozen=True)
class Conversation:
    key: str
    folder: Path

    @property
    def inbox(self) -> Path:
        return self.folder / "inbox"

    @property
    def transcript(self) -> Path:
        return self.folder / "transcript.jsonl"


class Conversations:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.root = private_dir(state_dir / "conversations")
        self.inboxed = private_dir(state_dir / "inboxed")
        self.started = private_dir(state_dir / "started")

    def folder(self, key: str) -> Path:
        """Where the conversation's folder is (made or not). A Linear id is a UUID; anything else
        is hashed, so no id names a path of its choosing."""
        return self.root / (key if _SAFE.match(key) else hashlib.sha256(key.encode()).hexdigest()[:40])

    def of(self, key: str) -> Conversation:
        conv = Conversation(key, self.folder(key))
        private_dir(conv.folder)
        private_dir(conv.inbox)
        return conv

    def all(self) -> list[Conversation]:
        """Every conversation that has a folder here (its key as the folder names it)."""
        return [Conversation(p.name, p) for p in sorted(self.root.iterdir()) if p.is_dir()]

    # --- the inbox ----------------------------------------------------------------------------
    def put(self, conv: Conversation, message: dict[str, Any]) -> bool:
        """Write the message into the conversation's inbox, once ever (see the module doc). True
        when this call wrote it, False when an earlier one had."""
        mid = message["messageId"]
        link = self.inboxed / mid
        staged = conv.folder / f".{mid}.json"
        if link.exists():
            if staged.exists():  # interrupted between the link and the rename: finish it
                os.replace(staged, conv.inbox / f"{time.time_ns():020d}-{mid}.json")
                _sync(conv.inbox)
            return False
        with open(os.open(staged, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.write(json.dumps(message))
            f.flush()
            os.fsync(f.fileno())
        os.link(staged, link)
        _sync(self.inboxed)
        os.replace(staged, conv.inbox / f"{time.time_ns():020d}-{mid}.json")
        _sync(conv.inbox)
        return True

    def pending(self, conv: Conversation) -> list[Path]:
        """The inbox's messages in arrival order. A file whose message a COMMAND was started with
        (its `started/` marker exists: the launcher died before removing it) is removed here."""
        files = []
        for path in sorted(conv.inbox.glob("*.json")):
            if (self.started / message_id(path)).exists():
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            files.append(path)
        return files

    def retract(self, conv: Conversation, mid: str) -> None:
        """The service cancelled the message before its ack: out of the inbox if still unread."""
        for path in conv.inbox.glob(f"*-{mid}.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def clear(self, conv: Conversation) -> int:
        """Linear said stop: the follow-ups nobody read are void."""
        files = self.pending(conv)
        for path in files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return len(files)

    # --- the transcript -----------------------------------------------------------------------
    def write_transcript(
        self,
        conv: Conversation,
        messages: Iterable[dict[str, Any]],
        activities: Iterable[dict[str, Any]] | None,
    ) -> None:
        """The whole transcript, made anew: `messages` (as claimed) and `activities` (as the service
        lists them; None: the service could not be asked, and the activities already in the file
        are kept) in time order, written whole and renamed into place."""
        entries = [message_entry(m) for m in messages]
        if activities is None:
            entries += [e for e in _read(conv.transcript) if e.get("kind") == "activity"]
        else:
            entries += [activity_entry(a) for a in activities]
        # In time order; at one instant (one transaction: a message and the notice it caused) the
        # message first; activities keep the service's order among themselves (a stable sort).
        entries.sort(key=lambda e: (_instant(e.get("at")), e.get("kind") == "activity"))
        staged = conv.folder / ".transcript.jsonl"
        with open(os.open(staged, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(e) + "\n" for e in entries)
        os.replace(staged, conv.transcript)

    def append(self, conv: Conversation, entry: dict[str, Any]) -> None:
        append_line(conv.transcript, entry)


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One line, appended in one write (O_APPEND): a reader sees whole lines."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def message_id(path: Path) -> str:
    """The message id an inbox file's name carries (`<nanoseconds>-<messageId>.json`)."""
    return path.stem.split("-", 1)[1]


def message_entry(m: dict[str, Any]) -> dict[str, Any]:
    """A message as the transcript shows it: what was asked, and Linear's context of a start."""
    prompt = m.get("prompt") or {}
    entry: dict[str, Any] = {
        "at": m.get("createdAt"),
        "from": "user",
        "kind": m.get("kind", "start"),
        "messageId": m.get("messageId"),
        "body": prompt.get("body"),
        "signal": prompt.get("signal"),
        "signalMetadata": prompt.get("signalMetadata"),
    }
    if entry["kind"] == "start":
        entry.update(
            issue=m.get("issue"),
            context=prompt.get("context"),
            guidance=prompt.get("guidance"),
            previousComments=prompt.get("previousComments"),
        )
    return entry


def activity_entry(a: dict[str, Any]) -> dict[str, Any]:
    return {
        "at": a.get("createdAt"),
        "from": a.get("from", "agent"),
        "kind": "activity",
        "type": a.get("type"),
        "body": a.get("body"),
        "content": a.get("content"),
        "signal": a.get("signal"),
        "signalMetadata": a.get("signalMetadata"),
    }


def _instant(at: Any) -> datetime:
    try:
        moment = datetime.fromisoformat(str(at))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def _sync(folder: Path) -> None:
    """A rename or link is durable once its folder is synced."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
