"""What every agent's runner does around its CLI, whichever the agent: read the COMMAND's message,
speak through the narrator, find the CLI on the PATH the orchestrator gives (or say how to install
it), word the first user turn, keep the token that speaks in Linear from the agent, start the CLI
as a child of its own, then the loop while it works (what it says, the follow-ups, the questions
to the person and their timeouts, Linear's stop), and its end: the answer, or a failure said once.
The agent's own protocol is its module's (`claude`, `codex`): a subclass of `Runner` filling in
the hooks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar, Generic, TypeVar

from orchestrator import voice
from orchestrator.messages import request_text
from orchestrator.runners import child
from orchestrator.runners.asks import Ask, Asks, Question, verdict
from orchestrator.runners.inbox import Inbox
from orchestrator.runners.lines import JsonLines
from orchestrator.runners.narrator import Narrator
from orchestrator.runners.store import Store, conversation_folder


@dataclass(frozen=True)
class Options:
    approval_timeout: float = 900.0  # seconds a question waits for the person in Linear
    model_api_timeout: float = 600.0  # seconds an agent may keep retrying an unreachable model API


STOP_WAIT = 1.5  # seconds for the interrupted turn to end, then as long for the CLI to exit
R = TypeVar("R")  # what the agent asks its host (a permission prompt, an approval)


class Runner(Generic[R]):
    """An agent's runner: `prepare` (its state from the store) and `run` (start the CLI, then
    `work`), and the hooks `work` calls while the CLI runs."""

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
        self.asks: Asks[R] = Asks(narrator, options.approval_timeout)
        self.proc: subprocess.Popen[bytes] | None = None  # the CLI, once started
        self.lines: JsonLines | None = None  # what it says and is told
        self.last_event = time.monotonic()  # when it last said something
        self.prepare()

    def prepare(self) -> None:
        """The agent's own state, from what the store kept."""

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

    def _start(self, argv: list[str], env: dict[str, str]) -> bool:
        """The CLI started in the working directory, in a process group of its own (`child`)."""
        try:
            self.proc = child.start(argv, env, self.workdir)
        except OSError as exc:
            self.fail(f"{self.title} (`{argv[0]}`) could not be started: {exc}")
            return False
        self.lines = JsonLines(self.proc)
        return True

    def work(self) -> int:
        """While the CLI runs: what it says (`_pump`), the follow-ups (the answer to what it asked,
        else words for it), the questions nobody answered, Linear's stop; until it is done (then
        `_close`d) or ends. The exit code."""
        while True:
            alive = self._pump(0.2)
            self._check()
            if self.failed:
                self._close(grace=2.0)
                return 1
            if not alive:
                break  # its stdout closed: it ended
            if self.stopping:
                return self._stop()
            self._follow_ups()
            self._asks_due()
            self.narrator.tick()
            if self._finished():
                self._close(grace=10.0)
                break
        return self._ended()

    def _follow_ups(self) -> None:
        """Each follow-up in the inbox, oldest first: the answer to what the agent asked, else words
        for it; removed once taken in (one the agent did not take stays for the next COMMAND)."""
        while (found := self.inbox.oldest()) is not None:
            path, message = found
            words = said(message)
            if self.asks:
                ask = self.asks.answer(words)
                if ask is not None:  # (else: the next question of the same ask is asked)
                    self._answered(ask, words)
                    self.asks.post()
            elif not self._tell(words or "Continue."):
                return
            Inbox.taken(path)

    def _asked(self, request: R) -> None:
        """The agent asks (a permission, a question): in Linear, unless the run is being stopped."""
        if self.stopping:
            self._refuse(request, "Linear asked the agent to stop.")
        else:
            self.asks.add(request, self._questions(request))

    # --- the agent's part of `work` --------------------------------------------------------------
    def _pump(self, timeout: float) -> bool:
        """Read what the CLI wrote (waiting up to `timeout`); False once its stdout is closed."""
        raise NotImplementedError

    def _check(self) -> None:
        """Anything the agent's runner looks at between reads."""

    def _tell(self, text: str) -> bool:
        """The person's words to the agent; False when it did not take them."""
        raise NotImplementedError

    def _answered(self, ask: Ask[R], words: str) -> None:
        """The person answered all of `ask` (their last `words`): the agent hears it."""
        raise NotImplementedError

    def _questions(self, request: R) -> list[Question]:
        """What Linear asks the person for this request."""
        raise NotImplementedError

    def _refuse(self, request: R, why: str) -> None:
        """The agent is told no (`why`, where it can read it)."""
        raise NotImplementedError

    def _asks_due(self) -> None:
        """The asks nobody answered within --approval-timeout."""
        while (ask := self.asks.overdue()) is not None:
            self._unanswered(ask)
            self.asks.post()

    def _verdict(self, what: str, answer: str, words: str) -> tuple[bool | None, str]:
        """The person's Allow or Deny on `what` (None: other words), acknowledged in Linear at once
        (ephemeral: the person sees the agent took it; the session page keeps it), and why not."""
        allowed = verdict(answer)
        if allowed:
            self.narrator.note(f"Allowed in Linear: {what}", ephemeral=True)
            return True, ""
        if allowed is False:
            self.narrator.note(f"Denied in Linear: {what}", ephemeral=True)
            return False, "Denied by the person in Linear."
        self.narrator.note(f"Not allowed in Linear: {what}", ephemeral=True)
        return None, f"Not allowed; the person said in Linear: {words}"

    def _unanswered(self, ask: Ask[R]) -> None:
        """Nobody answered `ask` within --approval-timeout: refused."""
        raise NotImplementedError

    def _finished(self) -> bool:
        """Done: nothing runs, nothing is asked, nothing waits."""
        raise NotImplementedError

    def _close(self, grace: float) -> None:
        """Its stdin closed: it ends (what it still says read) once it has been quiet `grace` seconds."""
        assert self.proc is not None and self.lines is not None
        self.lines.close_stdin()
        while self._pump(0.1) and self.proc.poll() is None:
            if time.monotonic() - self.last_event > grace:
                break
        child.end(self.proc, grace=1.0)

    def _stop(self) -> int:
        """Linear's stop: the agent's turn interrupted, a moment for it to end, then stdin closed and
        the CLI ended (its session saved: a later follow-up resumes it)."""
        self._interrupt()
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline and not self._interrupted() and self._pump(0.1):
            pass
        self._close(grace=STOP_WAIT)
        self.narrator.flush()
        return 0

    def _interrupt(self) -> None:
        """Ask the agent to stop its turn."""
        raise NotImplementedError

    def _interrupted(self) -> bool:
        """The interrupted turn has ended."""
        raise NotImplementedError

    def _ended(self) -> int:
        """The CLI ended: Linear hears its answer, or why it failed. The exit code."""
        assert self.proc is not None and self.lines is not None
        code = self.proc.wait()
        if self.stopping:
            self.narrator.flush()
            return 0
        answer = self._answer()
        if answer is not None:
            self.narrator.finish(answer)
            return 0
        self.fail(self._failure() or self.died(code, self.lines.tail()))
        return 1

    def _answer(self) -> str | None:
        """The agent's answer, if it finished."""
        raise NotImplementedError

    def _failure(self) -> str | None:
        """Why it did not finish, as the agent said it (None: it did not say)."""
        return None


def said(message: dict[str, Any]) -> str:
    """A follow-up's words: its text, else the option the person picked."""
    prompt = message.get("prompt") or {}
    return str(prompt.get("body") or (prompt.get("signalMetadata") or {}).get("value") or "").strip()


def host(agent: type[Runner[Any]], agent_args: list[str], options: Options) -> int:
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
