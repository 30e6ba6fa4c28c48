"""Housekeeping (`--keep-days N`; 0: never): what is old and finished leaves the state directory,
so that a machine running the agent for a year does not keep a folder per conversation and a few
files per message for ever. It runs at start-up and then about once an hour.

Why this cannot weaken exactly-once: a message can be delivered again only while its queue row
exists on the service, and the service dead-letters it after its attempt limit, the backoff capped
at 15 minutes (by default 5 attempts: done within hours). N >= 1 days after a message last changed
here no redelivery of it can come, so its `inboxed/` link and journal row, which refuse a second
hand-over, have nothing left to refuse. Even so, nothing is removed of a message the journal calls
unfinished or that waits in an inbox, nor of a conversation whose COMMAND runs.

What goes, once N days have passed without a change:
- a conversation's folder (inbox, transcript, repository), when nothing in it and none of its
  messages changed, after its worktree (removed only when nothing in it is uncommitted, as at the
  conversation's end; a worktree kept keeps its folder too). A conversation resumed in Linear after
  that starts here anew: the transcript from its agent session's activities and the new message;
- each message's `inboxed/`, `started/`, `exited/` and `responded/` file and `logs/<messageId>.stderr`;
- the journal rows of finished messages whose conversation folder is gone (while it is here, its
  transcript is made from them).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.conversations import Conversation, Conversations, conversation_key, message_id
from orchestrator.journal import UNFINISHED, Age, Journal
from orchestrator.messages import is_uuid
from orchestrator.workplace import Workplace

DAY_SECONDS = 86_400
EVERY_SECONDS = 3_600.0  # between two runs while the orchestrator runs
PER_MESSAGE = ("inboxed", "started", "exited", "responded", "logs")  # folders holding a file per message


@dataclass
class Pruned:
    conversations: list[Path] = field(default_factory=list)  # the folders removed
    files: int = 0
    rows: int = 0
    kept: list[str] = field(default_factory=list)  # why an old conversation's worktree stayed


class Housekeeping:
    def __init__(
        self,
        state_dir: Path,
        keep_days: int,
        journal: Journal,
        conversations: Conversations,
        workplace: Workplace,
        # The messages whose COMMAND runs or has not been reaped yet: this process's, and an
        # earlier run's (found by the orchestrator at start-up, by its marker's pid, and watched).
        running: Callable[[], set[str]],
    ) -> None:
        self.state_dir = state_dir
        self.keep_days = keep_days
        self.journal = journal
        self.conversations = conversations
        self.workplace = workplace
        self.running = running
        self._next = 0.0  # (monotonic) when the next run is due

    def due(self) -> bool:
        return self.keep_days > 0 and time.monotonic() >= self._next

    def run(self) -> Pruned:
        self._next = time.monotonic() + EVERY_SECONDS
        cutoff = time.time() - self.keep_days * DAY_SECONDS
        ages = self.journal.ages()
        running = self.running()
        mine: dict[Path, list[Age]] = {}  # each conversation folder's messages
        for a in ages:
            mine.setdefault(self._folder(a), []).append(a)
        # The messages nothing of which goes: unfinished, changed lately, waiting in an inbox, or of
        # a conversation whose COMMAND runs.
        keep = {a.message_id for a in ages if a.state in UNFINISHED or a.updated_at >= cutoff}
        keep |= {message_id(p) for p in self.conversations.root.glob("*/inbox/*.json")}
        for its in mine.values():
            if any(a.message_id in running for a in its):
                keep.update(a.message_id for a in its)
        pruned = Pruned()
        for found in self.conversations.all():
            its = mine.get(found.folder, [])
            if (
                any(a.message_id in keep for a in its)
                or any(found.inbox.glob("*.json"))
                or _newest(found.folder) >= cutoff
            ):
                continue
            # Its key as its messages say it (a folder's name is a hash of a key that is no id).
            conv = Conversation(_key(its[0]) if its else found.key, found.folder)
            said = self.workplace.end(conv)
            if self.workplace.worktree_path(conv).exists():
                pruned.kept.append(said or f"kept {conv.key}: its worktree is there and --worktree is off")
                continue
            shutil.rmtree(conv.folder)
            pruned.conversations.append(conv.folder)
        for name in PER_MESSAGE:
            folder = self.state_dir / name
            for path in sorted(folder.iterdir()) if folder.is_dir() else []:
                mid = path.name.removesuffix(".stderr")
                if not is_uuid(mid) or mid in keep or path.lstat().st_mtime >= cutoff:
                    continue
                path.unlink(missing_ok=True)
                pruned.files += 1
        gone = [a.message_id for a in ages if a.message_id not in keep and not self._folder(a).exists()]
        pruned.rows = self.journal.drop(gone) if gone else 0
        return pruned

    def _folder(self, a: Age) -> Path:
        return self.conversations.folder(_key(a))


def _key(a: Age) -> str:
    return conversation_key({"agentSessionId": a.agent_session_id, "sessionId": a.session_id})


def _newest(folder: Path) -> float:
    """When anything in the folder (or the folder itself) last changed."""
    newest = folder.lstat().st_mtime
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            newest = max(newest, (Path(top) / name).lstat().st_mtime)
    return newest
