"""What every agent's runner does around its CLI, whichever the agent: read the COMMAND's message,
speak through the narrator, find the CLI on the PATH the orchestrator gives (or say how to install
it), word the first user turn, keep the token that speaks in Linear from the agent, hear Linear's
stop, and say a failure once. The agent's own process and protocol are its module's (`claude`,
`codex`), a subclass of `Runner`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

from orchestrator import voice
from orchestrator.messages import request_text
from orchestrator.runners.inbox import Inbox
from orchestrator.runners.narrator import Narrator
from orchestrator.runners.store import Store, conversation_folder


@dataclass(frozen=True)
class Options:
    approval_timeout: float = 900.0  # seconds a question waits for the person in Linear
    model_api_timeout: float = 600.0  # seconds an agent may keep retrying an unreachable model API


class Runner:
    name: ClassVar[str]  # as `devpilot-agent NAME` calls it: `claude`
    title: ClassVar[str]  # as the person reads it: `Claude Code`
    command: ClassVar[str]  # its CLI, found on PATH: `claude`
    install: ClassVar[str]  # how to install the version it is tested with

    def __init__(
        self,
        message: dict[str, Any],
        agent_args: list[str],
        options: Options,
        environ: dict[str, str],
        narrator: Narrator,
    ) -> None:
        self.message = message
        self.agent_args = agent_args
        self.options = options
        self.environ = environ
        self.narrator = narrator
        self.workdir = Path(environ.get("DEVPILOT_WORKDIR") or os.getcwd())
        self.inbox = Inbox(Path(environ["DEVPILOT_INBOX"]) if environ.get("DEVPILOT_INBOX") else None)
        self.store = Store(conversation_folder(environ), self.name)
        self.stopping = False  # Linear asked the agent to stop (SIGTERM)
        self.failed = False  # an error was posted: the run is over

    def run(self) -> int:
        raise NotImplementedError

    def cli(self) -> str | None:
        """The agent's CLI on the PATH the orchestrator gives; when it is not there, Linear hears
        how to install it."""
        found = shutil.which(self.command, path=self.environ.get("PATH"))
        if found is None:
            self.fail(
                f"{self.title} is not installed on this machine: `{self.command}` is not on the PATH the "
                f"orchestrator gives its agent ({self.environ.get('PATH', '')}). Install it with "
                f"`{self.install}`, then assign again or reply here."
            )
        return found

    def hear_stop(self) -> None:
        """Linear's stop (SIGTERM to the COMMAND's group, which the CLI is not in) reaches the runner."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def first_turn(self, resuming: bool) -> str:
        """The agent's first user turn: the request; a follow-up that starts the agent anew (its own
        session lost) is pointed at the conversation so far."""
        text = request_text(self.message) or "Continue."
        if resuming or self.message.get("kind", "start") == "start":
            return text
        transcript = self.environ.get("DEVPILOT_TRANSCRIPT")
        earlier = (
            f" (every message and reply so far, as JSON lines, is in {transcript})" if transcript else ""
        )
        return f"This continues a conversation from Linear{earlier}. The person now says:\n\n{text}"

    def agent_env(self) -> dict[str, str]:
        # The agent runs code it did not write: the token that speaks in Linear stays with the runner.
        return {k: v for k, v in self.environ.items() if k != "DEVPILOT_AGENT_TOKEN"}

    def fail(self, reason: str) -> None:
        """The run failed: Linear hears why, once."""
        if not self.failed:
            self.failed = True
            self.narrator.fail(reason)

    def died(self, code: int, stderr_tail: str) -> str:
        """Why the run failed when the CLI ended without finishing."""
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"{self.title} {how} before it finished.{stderr_tail}"


def said(message: dict[str, Any]) -> str:
    """A follow-up's words: its text, else the option the person picked."""
    prompt = message.get("prompt") or {}
    return str(prompt.get("body") or (prompt.get("signalMetadata") or {}).get("value") or "").strip()


def host(agent: type[Runner], agent_args: list[str], options: Options) -> int:
    """Run `agent` as this COMMAND: its message from stdin, its words to its agent session."""
    try:
        message = json.load(sys.stdin)
    except ValueError as exc:
        print(f"devpilot-agent {agent.name}: stdin holds no message ({exc})", file=sys.stderr)
        return 2
    environ = dict(os.environ)
    speaker = voice.Voice(environ, retries=3) if not voice.missing(environ, "activity") else None
    narrator = Narrator(speaker)
    try:
        return agent(message, agent_args, options, environ, narrator).run()
    finally:
        print(f"devpilot-agent {agent.name}: {narrator.summary()}", file=sys.stderr)
        if speaker is not None:
            speaker.close()
