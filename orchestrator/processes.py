"""The COMMANDs that run on this machine: the ones this process started (its children), and the
ones an earlier run of the orchestrator started that still run, found by the pid their `started/`
marker holds (checked against the process's own `DEVPILOT_MESSAGE_ID`: a pid can be reused) and
watched until they end. Each one that ends is reported once; one that a stop ended, never.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import commands
from orchestrator.conversations import Conversation, Conversations, conversation_key
from orchestrator.journal import Journal
from orchestrator.log import Log
from orchestrator.messages import name
from orchestrator.signals import Signals

# What is done once a COMMAND has ended: its message, its conversation, its exit code (None: unknown).
AfterExit = Callable[[dict[str, Any], Conversation, int | None], None]


@dataclass
class Running:
    """A COMMAND this process started: its message and the conversation it speaks in."""

    proc: subprocess.Popen[bytes]
    message: dict[str, Any]
    conv: Conversation
    name: str


@dataclass
class Earlier:
    """A COMMAND an earlier run of the orchestrator started, found running: not this process's
    child, so watched by its marker's pid, and its exit code read from `exited/<messageId>`."""

    pid: int
    message: dict[str, Any]
    conv: Conversation
    name: str


@dataclass
class Processes:
    state_dir: Path
    journal: Journal
    conversations: Conversations
    log: Log
    signals: Signals
    running: dict[str, Running] = field(default_factory=dict)  # by message id
    earlier: dict[str, Earlier] = field(default_factory=dict)  # by message id: watched until reported
    stopped: set[str] = field(default_factory=set)  # message ids whose process a stop ended: no exit report

    def marker(self, message_id: str) -> Path:
        return self.state_dir / "started" / message_id

    def messages(self) -> set[str]:
        """The messages whose COMMAND runs or has not been reaped yet."""
        return set(self.running) | set(self.earlier)

    def find_earlier(self) -> None:
        """At start-up, once: the COMMANDs an earlier run started that still run are watched."""
        for a in self.journal.ages():
            mid = a.message_id
            if a.state in ("starting", "started") and mid not in self.running:
                pid = commands.running_pid(self.marker(mid), mid)
                entry = self.journal.get(mid) if pid else None
                if entry is not None:
                    self._watch(pid, entry.message)

    def busy(self, conv: Conversation) -> bool:
        """Whether a COMMAND of this conversation runs: one this process started, or one an
        earlier run started (found by its marker's pid, checked to still be that message's). One
        that ended counts until `reap` has reported it."""
        if any(r.conv.folder == conv.folder for r in self.running.values()):
            return True
        if any(e.conv.folder == conv.folder for e in self.earlier.values()):
            return True
        return bool(self._earlier_processes(conv.key))

    def reap(self, after_exit: AfterExit) -> None:
        """Each COMMAND that ended: forgotten as running and `after_exit` done (its last word),
        SIGTERM waiting for both (a SIGTERM between them would leave the last word unsaid, and the
        next run, finding the COMMAND gone, would not say it either: Linear would wait on the
        session)."""
        for mid, run in list(self.running.items()):
            with self.signals.uninterrupted():
                code = run.proc.poll()
                if code is None:
                    continue
                del self.running[mid]
                self.log(
                    "finished", f"{run.name} finished with exit code {code}", messageId=mid, exitCode=code
                )
                if mid in self.stopped:
                    self.stopped.discard(mid)
                    continue
                after_exit(run.message, run.conv, code)
        for mid, earlier in list(self.earlier.items()):
            with self.signals.uninterrupted():  # (as above, for a COMMAND an earlier run started)
                if commands.running_pid(self.marker(mid), mid):
                    continue
                del self.earlier[mid]
                exit_code = commands.exit_code(self.state_dir / "exited" / mid)
                self.log(
                    "finished",
                    f"{earlier.name} (started before the orchestrator restarted) finished with exit code "
                    f"{'unknown' if exit_code is None else exit_code}",
                    messageId=mid,
                    exitCode=exit_code,
                )
                if mid in self.stopped:
                    self.stopped.discard(mid)
                    continue
                after_exit(earlier.message, earlier.conv, exit_code)

    def end(self, conv: Conversation, grace: float) -> int:
        """Linear's stop: every process of the conversation, this process's and an earlier run's,
        gets SIGTERM to its process group, then SIGKILL after `grace`, and so does what they
        started in sessions of their own; none is reported as ended. How many process groups
        there were."""
        groups = [
            r.proc.pid
            for r in self.running.values()
            if r.conv.folder == conv.folder and r.proc.poll() is None
        ]
        self.stopped.update(k for k, r in self.running.items() if r.conv.folder == conv.folder)
        groups += self._earlier_processes(conv.key)
        self.stopped.update(k for k, e in self.earlier.items() if e.conv.folder == conv.folder)
        commands.end_groups(groups, grace, self._alive)
        # What the conversation's COMMANDs started outside their process groups: named by the
        # inbox every COMMAND of the conversation, and only it, is given.
        commands.end_leftovers(f"DEVPILOT_INBOX={conv.inbox}", grace)
        return len(groups)

    def _earlier_processes(self, key: str) -> list[int]:
        """The pids of the conversation's COMMANDs an earlier run started that still run; each is
        watched from now on (`reap` reports its exit)."""
        pids = []
        for entry in self.journal.started_in(key):
            mid = entry.message_id
            if mid in self.running:
                continue
            pid = commands.running_pid(self.marker(mid), mid)
            if pid:
                pids.append(pid)
                self._watch(pid, entry.message)
        return pids

    def _watch(self, pid: int, m: dict[str, Any]) -> None:
        if m["messageId"] not in self.earlier:
            conv = self.conversations.of(conversation_key(m))
            self.earlier[m["messageId"]] = Earlier(pid, m, conv, name(m))
            self.log("watching", f"{name(m)} runs, started before the orchestrator restarted (pid {pid})")

    def _alive(self, pid: int) -> bool:
        for r in self.running.values():
            if r.proc.pid == pid:
                return r.proc.poll() is None
        return commands.alive(pid)
