"""Starting COMMAND with a conversation's next message: where it runs (the conversation's worktree,
made now if `--worktree` asks for one), its transcript made anew, its environment
(`orchestrator.workplace`), then the launcher (`orchestrator.commands`), which takes the message out
of the inbox. The journal says `starting` before the launch and `started` after it: a crash in
between is settled by the launcher's marker (`orchestrator.journal`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.client import Api, Rejected, Unreachable
from orchestrator.commands import Launch, launch
from orchestrator.config import Config
from orchestrator.conversations import Conversation, Conversations, conversation_key
from orchestrator.journal import Journal
from orchestrator.last_word import LastWord
from orchestrator.log import Log
from orchestrator.messages import name as _name
from orchestrator.messages import speaks_in
from orchestrator.processes import Processes, Running
from orchestrator.state import private_dir
from orchestrator.workplace import Workplace
from orchestrator.worktrees import WorktreeError


@dataclass
class Starter:
    cfg: Config
    api: Api
    journal: Journal
    conversations: Conversations
    workplace: Workplace
    processes: Processes
    last_word: LastWord
    log: Log

    def start(self, conv: Conversation, path: Path) -> None:
        """Start COMMAND with the conversation's oldest waiting message (the launcher takes it out
        of the inbox): at most one COMMAND per conversation runs."""
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # (read and removed by an agent meanwhile)
        mid = m["messageId"]
        name = _name(m)
        self.journal.mark(mid, "starting")
        repo = self.workplace.repository(conv, m)
        try:
            workdir = self.workplace.directory(conv, repo, m)
        except WorktreeError as exc:
            self.journal.mark(mid, "delivered")
            self.log("error", f"could not make the worktree for {name}: {exc}", messageId=mid)
            self.last_word.post(
                m, {"type": "error", "body": f"devpilot could not make a worktree: {exc}"}, f"{mid}:worktree"
            )
            path.unlink(missing_ok=True)
            return
        self._write_transcript(conv, m)
        env = self.workplace.environment(m, conv, workdir, repo)
        spec = Launch(
            marker=self.processes.marker(mid),
            message=path,
            errors=private_dir(self.cfg.state_dir / "logs") / f"{mid}.stderr",
            taken_from_inbox=True,
            exited=private_dir(self.cfg.state_dir / "exited") / mid,
        )
        try:
            proc = launch(spec, self.cfg.command, env, workdir)
        except OSError as exc:
            self.journal.mark(mid, "delivered")
            self.log("error", f"could not start {name}: {exc}", messageId=mid)
            return
        self.journal.mark(mid, "started")
        self.processes.running[mid] = Running(proc, m, conv, name)
        self.log("started", f"started {name} (pid {proc.pid})", messageId=mid, pid=proc.pid)

    def _write_transcript(self, conv: Conversation, m: dict[str, Any]) -> None:
        """The conversation so far, before its COMMAND starts: every message this machine had,
        and every activity of the agent session as the service has them (kept from the last
        transcript when the service cannot be asked now)."""
        key = conversation_key(m)
        messages = [e.message for e in self.journal.in_conversation(key)]
        activities: list[dict[str, Any]] | None = []
        agent = speaks_in(m)
        if agent:
            try:
                activities = self.api.activities(agent)
            except (Unreachable, Rejected) as exc:
                self.log("transcript", f"activities not read ({exc}); the transcript keeps the last ones")
                activities = None
        self.conversations.write_transcript(conv, messages, activities)
