"""Where a conversation's COMMAND runs, and with what: its repository, its working directory (with
`--worktree`, a git worktree of its own), and its environment.

Every COMMAND of one conversation runs in the same directory: its repository's path (the one its
start named, remembered in the conversation's folder since follow-ups name none; else this
machine's only `--repo`; else the directory the orchestrator was started in), or the
conversation's own worktree of it. COMMAND's environment is built here, never inherited
(`orchestrator.environment`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import environment, worktrees
from orchestrator.conversations import Conversation
from orchestrator.messages import request_text, speaks_in
from orchestrator.repositories import LocalRepo
from orchestrator.state import TOKEN_ENV, private_dir
from orchestrator.worktrees import WorktreeError
from shared.wire import agent_tokens
from shared.wire.messages import repository_key


@dataclass(frozen=True)
class Workplace:
    token: str  # the machine's: never in COMMAND's environment
    state_dir: Path
    workdir: Path  # the directory the orchestrator was started in
    worktree: bool
    repositories: list[LocalRepo]
    pass_env: list[str]
    endpoints: dict[str, str]  # the routes COMMAND's own calls go to (activities, plan)

    def repository(self, conv: Conversation, m: dict[str, Any]) -> LocalRepo | None:
        """The repository the conversation works in: the one its start named (remembered in the
        conversation's folder, as follow-ups name none), else this machine's only --repo, else
        none (the directory the orchestrator runs in)."""
        known = {r.key: r for r in self.repositories}
        remembered = conv.folder / "repository"
        named = m.get("repository")
        if isinstance(named, dict) and named.get("fullName"):
            key = repository_key(str(named.get("hostname") or ""), str(named["fullName"]))
            if key in known:
                remembered.write_text(key, encoding="utf-8")
                return known[key]
        try:
            key = remembered.read_text(encoding="utf-8").strip()
        except OSError:
            key = ""
        if key in known:
            return known[key]
        return self.repositories[0] if len(self.repositories) == 1 else None

    def checkout(self, repo: LocalRepo | None) -> Path:
        return repo.path if repo is not None else self.workdir

    def directory(self, conv: Conversation, repo: LocalRepo | None, m: dict[str, Any] | None = None) -> Path:
        """Where the conversation's COMMANDs run: its repository's path (or the directory the
        orchestrator was started in), or, with --worktree, the conversation's own worktree of it
        (made now if it is not there, on the conversation's branch). Raises WorktreeError when git
        cannot make it."""
        base = self.checkout(repo)
        if not self.worktree:
            return base
        top = worktrees.toplevel(base)
        if top is None:
            raise WorktreeError(f"{base} is not a git checkout")
        return worktrees.ensure(top, self.worktree_path(conv), self.branch(conv, m or {}))

    def branch(self, conv: Conversation, m: dict[str, Any]) -> str:
        """The conversation's branch: `devpilot/<issue identifier>-<conversation>` (`devpilot/eng-7-…`),
        so Linear's GitHub and GitLab integrations link a pull request made from it to the issue,
        as they link any branch whose name holds the identifier. Named once, at its first COMMAND,
        and remembered in the conversation's folder: the issue may be renamed or moved later."""
        remembered = conv.folder / "branch"
        try:
            return remembered.read_text(encoding="utf-8").strip() or self._branch(conv, m)
        except OSError:
            name = self._branch(conv, m)
            remembered.write_text(name, encoding="utf-8")
            return name

    def _branch(self, conv: Conversation, m: dict[str, Any]) -> str:
        identifier = str((m.get("issue") or {}).get("identifier") or "")
        slug = re.sub(r"[^a-z0-9]+", "-", identifier.lower()).strip("-")
        return f"devpilot/{slug}-{conv.folder.name}" if slug else f"devpilot/{conv.folder.name}"

    def worktree_path(self, conv: Conversation) -> Path:
        return self.state_dir / "worktrees" / conv.folder.name

    def end(self, conv: Conversation) -> str | None:
        """The conversation is over: its worktree (if any) is removed, unless it holds uncommitted
        work, and its branch with it unless it has commits. What happened, for the log (None: no
        worktrees here)."""
        if not self.worktree:
            return None
        done = worktrees.remove(self.checkout(self.repository(conv, {})), self.worktree_path(conv))
        if done.kept is not None:
            return f"kept the worktree of {conv.key} at {self.worktree_path(conv)}: {done.kept}"
        if done.branch is not None:
            return f"removed the worktree of {conv.key}; its branch {done.branch} stays (it has commits)"
        return f"removed the worktree of {conv.key}"

    def environment(
        self, m: dict[str, Any], conv: Conversation, directory: Path, repo: LocalRepo | None
    ) -> dict[str, str]:
        """COMMAND's environment: its message's and conversation's `DEVPILOT_*`, the basics and the
        --pass-env names, never the machine's token or anything else of this process's."""
        mid = m["messageId"]
        issue = m.get("issue") or {}
        prompt = m.get("prompt") or {}
        own = {
            "DEVPILOT_MESSAGE_ID": mid,
            "DEVPILOT_SESSION_ID": m["sessionId"],
            "DEVPILOT_QUEUE_ID": m["queueId"],
            "DEVPILOT_ISSUE_ID": str(issue.get("id") or ""),
            "DEVPILOT_ISSUE_IDENTIFIER": str(issue.get("identifier") or ""),
            "DEVPILOT_ISSUE_URL": str(issue.get("url") or ""),
            "DEVPILOT_KIND": str(m.get("kind") or "start"),
            "DEVPILOT_PROMPT": request_text(m),
            "DEVPILOT_SIGNAL": str(prompt.get("signal") or ""),
            "DEVPILOT_TRANSCRIPT": str(conv.transcript),
            "DEVPILOT_INBOX": str(conv.inbox),
            "DEVPILOT_WORKDIR": str(directory),
            "DEVPILOT_RESPONDED_FILE": str(private_dir(self.state_dir / "responded") / mid),
        }
        if repo is not None:
            own["DEVPILOT_REPOSITORY"] = repo.full_name
        agent = speaks_in(m)
        if agent:
            # What `devpilot-orchestrator activity` and `plan` need to speak in this agent session,
            # and only it.
            own.update(
                {
                    "DEVPILOT_AGENT_SESSION_ID": agent,
                    "DEVPILOT_ACTIVITIES_URL": self.endpoints.get("activities", ""),
                    "DEVPILOT_PLAN_URL": self.endpoints.get("plan", ""),
                    "DEVPILOT_AGENT_TOKEN": agent_tokens.mint(self.token, m["orchestratorId"], agent),
                }
            )
        env = environment.for_command(os.environ, self.pass_env, own)
        for k in [k for k, v in env.items() if k == TOKEN_ENV or v == self.token]:
            del env[k]  # the machine's token never reaches COMMAND, even when passed on purpose
        return env
