"""When each conversation's COMMANDs run: its oldest waiting message starts COMMAND when none of its
COMMANDs runs and `--max-parallel` allows; what happens when one ends; Linear's stop.

A conversation (an agent session) is one thread on this machine: at most one COMMAND of it runs at
a time; a follow-up that arrives meanwhile lands in that COMMAND's inbox; every COMMAND of it gets
the whole transcript and runs in the same directory (`orchestrator.workplace`). A conversation
whose last word is said is over: its worktree goes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config import Config
from orchestrator.conversations import Conversation, Conversations, conversation_key, message_id
from orchestrator.journal import Journal
from orchestrator.last_word import LastWord
from orchestrator.log import Log
from orchestrator.processes import Processes
from orchestrator.signals import Signals
from orchestrator.starter import Starter
from orchestrator.workplace import Workplace


@dataclass
class Scheduler:
    cfg: Config
    journal: Journal
    conversations: Conversations
    workplace: Workplace
    processes: Processes
    starter: Starter
    last_word: LastWord
    log: Log
    signals: Signals
    # Conversations that may have messages waiting in their inbox (all of them at start-up).
    _waiting: dict[Path, Conversation] = field(init=False)

    def __post_init__(self) -> None:
        self._waiting = {c.folder: c for c in self.conversations.all()}

    def may_wait(self, conv: Conversation) -> None:
        """A message of the conversation went into its inbox: looked at by the next `tend`."""
        self._waiting[conv.folder] = conv

    def forget(self, folder: Path) -> None:
        """The conversation's folder is gone (housekeeping)."""
        self._waiting.pop(folder, None)

    def tend(self) -> None:
        """Reap the COMMANDs that ended, then start the next message of each conversation that has
        one waiting and no COMMAND running, while --max-parallel allows."""
        self.reap()
        if self.signals.stopping:
            return
        for folder, conv in list(self._waiting.items()):
            if len(self.processes.running) >= self.cfg.max_parallel:
                return
            if self.processes.busy(conv):
                continue
            waiting = self.conversations.pending(conv)
            if not waiting:
                del self._waiting[folder]
                continue
            entry = self.journal.get(message_id(waiting[0]))
            if entry is None or entry.state != "inboxed":  # (inboxed: not acked yet, never started)
                self.starter.start(conv, waiting[0])

    def reap(self) -> None:
        self.processes.reap(self._after_exit)

    def room(self) -> int:
        """How many messages to claim now. Messages of a conversation whose COMMAND runs go to its
        inbox whatever the load; the rest wait here for a slot, at most --max-parallel of them
        beyond the slots themselves (more stays on the service, which may give it to the user's
        other machine)."""
        waiting = sum(
            len(self.conversations.pending(c)) for c in self._waiting.values() if not self.processes.busy(c)
        )
        return 2 * self.cfg.max_parallel - len(self.processes.running) - waiting

    def watching(self) -> bool:
        """Whether an earlier run's COMMAND is watched: its exit sends no SIGCHLD to wake the loop."""
        return bool(self.processes.earlier)

    def waiting_behind(self) -> bool:
        """Whether a message waits for its conversation's running COMMAND to exit."""
        return any(self.processes.busy(c) and self.conversations.pending(c) for c in self._waiting.values())

    def stop(self, m: dict[str, Any], name: str) -> None:
        """Linear's stop: end every process this machine runs for the conversation (SIGTERM to its
        process group, then SIGKILL after the grace period), drop the follow-ups nobody read, post
        the final response, and end the conversation (its worktree goes)."""
        mid = m["messageId"]
        conv = self.conversations.of(conversation_key(m))
        self.journal.mark(mid, "starting")
        groups = self.processes.end(conv, self.cfg.stop_grace)
        dropped = self.conversations.clear(conv)
        self.last_word.post(m, {"type": "response", "body": "Stopped, as asked in Linear."}, f"{mid}:stop")
        fd = os.open(self.processes.marker(mid), os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
        self.journal.mark(mid, "started")
        self.reap()
        self._end(conv)
        self.log(
            "stopped",
            f"{name}: stopped agent session {conv.key} ({groups} process group(s), "
            f"{dropped} unread follow-up(s) dropped)",
            messageId=mid,
        )

    def _after_exit(self, m: dict[str, Any], conv: Conversation, code: int | None) -> None:
        """COMMAND ended: its last word said (`orchestrator.last_word`); a conversation whose last
        word is said (or a plain assignment's, which has no agent session to wait in) is over,
        unless follow-ups it never read are waiting."""
        waiting = bool(self.conversations.pending(conv))
        over = self.last_word.after_exit(m, code, waiting)
        if (over or not m.get("agentSessionId")) and not waiting:
            self._end(conv)

    def _end(self, conv: Conversation) -> None:
        """The conversation is over: its worktree (if any) is removed unless work is uncommitted."""
        said = self.workplace.end(conv)
        if said:
            self.log("worktree", said)
