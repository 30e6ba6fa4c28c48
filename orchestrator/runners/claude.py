"""`devpilot-agent claude [CLAUDE_ARG]...`: Claude Code (the `claude` CLI) on the conversation's
message, live in Linear.

The CLI runs in `DEVPILOT_WORKDIR` with `-p --input-format stream-json --output-format stream-json
--verbose --permission-prompt-tool stdio` and the person's own flags (`--agent-arg`: permission
mode, allowed tools, model). Its first user turn is the request (on a start Linear's
promptContext, with the team's guidance); each follow-up that reaches the inbox while it works is
written into its stdin as the next user turn, and removed. Its session id is kept in the
conversation's folder (`orchestrator.runners.store`): the conversation's next COMMAND resumes it
(`--resume`). When every turn written is done (the CLI's `command_lifecycle` says so) and nothing
waits, stdin is closed, the CLI exits, and its last text is the `response`.

Permission prompts come over the same channel (the Agent SDK's control protocol: a
`control_request` `can_use_tool` on stdout, a `control_response` on stdin): each is an
`elicitation` with Linear's `select` (Allow / Deny); the person's pick, a follow-up, answers it, and
no answer within `--approval-timeout` denies it. A question the agent asks with its
`AskUserQuestion` tool is an elicitation too (its options as the `select`), the answer going back
as the tool's `answers`.

Linear's stop is SIGTERM: the CLI (in a process group of its own) gets the protocol's `interrupt`,
stdin is closed, and it ends with its session saved; a later follow-up resumes it. A CLI missing
from PATH, the model's API refusing the credentials, or a CLI that ends without a result is an
`error` naming the cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator import voice
from orchestrator.messages import request_text
from orchestrator.runners import child
from orchestrator.runners.claude_stream import (
    Cancelled,
    ClaudeStream,
    Effect,
    Init,
    Permission,
    Result,
    Retry,
    TurnEnded,
    Unsupported,
    parameter,
)
from orchestrator.runners.inbox import Inbox
from orchestrator.runners.narrator import Narrator, one_line
from orchestrator.runners.store import Store, conversation_folder

PINNED = "2.1.332"  # the version this runner is tested with (tests/fixtures/claude/)
INSTALL = f"npm install -g @anthropic-ai/claude-code@{PINNED}"
STREAM = ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
ALLOW, DENY = "Allow", "Deny"
YES = {"allow", "yes", "y", "ok", "approve", "approved", "go", "go ahead", "allow it"}
NO = {"deny", "no", "n", "denied", "don't", "do not", "stop", "reject"}
QUIET_AFTER_RESULT = 5.0  # seconds: a turn the CLI never reports done (an older CLI) counts as done
STOP_WAIT = 1.5  # seconds for the interrupted CLI to end its turn, then as long for it to exit
REFUSED = (401, 403)  # the model's API refusing the key: retrying will not help


@dataclass(frozen=True)
class Options:
    approval_timeout: float = 900.0


@dataclass
class Ask:
    """A permission prompt or a question, posted to Linear and waiting for the person."""

    permission: Permission
    deadline: float
    answers: dict[str, str] = field(default_factory=dict)
    posted: bool = False

    @property
    def question(self) -> dict[str, Any] | None:
        """The question being asked now (AskUserQuestion asks one to four, one at a time here)."""
        questions = self.permission.questions
        return questions[len(self.answers)] if len(self.answers) < len(questions) else None


def run(agent_args: list[str], options: Options) -> int:
    try:
        message = json.load(sys.stdin)
    except ValueError as exc:
        print(f"devpilot-agent claude: stdin holds no message ({exc})", file=sys.stderr)
        return 2
    environ = dict(os.environ)
    speaker = voice.Voice(environ, retries=3) if not voice.missing(environ, "activity") else None
    narrator = Narrator(speaker)
    try:
        return Claude(message, agent_args, options, environ, narrator).run()
    finally:
        print(f"devpilot-agent claude: {narrator.summary()}", file=sys.stderr)
        if speaker is not None:
            speaker.close()


class Claude:
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
        self.store = Store(conversation_folder(environ), "claude")
        saved = self.store.load()
        self.resume_id = saved.get("sessionId") if isinstance(saved.get("sessionId"), str) else None
        tasks = saved.get("tasks")
        self.stream = ClaudeStream(
            narrator, self.workdir, tasks=dict(tasks) if isinstance(tasks, dict) else {}
        )
        self._saved = json.dumps(saved, sort_keys=True)
        self.stopping = False
        self._reset()

    def _reset(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.open_turns: set[str] = set()
        self.result: Result | None = None  # the last turn's, while no newer turn was written
        self.asks: deque[Ask] = deque()
        self.failed = False  # an error was posted: the run is over
        self.started = False  # the CLI said init
        self.last_event = time.monotonic()
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._out, self._out_open = b"", True
        self._err, self._err_open = b"", True

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        cli = shutil.which("claude", path=self.environ.get("PATH"))
        if cli is None:
            self.narrator.fail(
                "Claude Code is not installed on this machine: `claude` is not on the PATH the "
                f"orchestrator gives its agent ({self.environ.get('PATH', '')}). Install it with "
                f"`{INSTALL}`, then assign again or reply here."
            )
            return 1
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        first = self._first_turn(resuming=self.resume_id is not None)
        code = self._session(cli, first, self.resume_id)
        if code is None:  # the session to resume is gone (pruned by the CLI): a new one
            self._reset()
            code = self._session(cli, self._first_turn(resuming=False), None) or 0
        return code

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _first_turn(self, resuming: bool) -> str:
        text = request_text(self.message) or "Continue."
        if resuming or self.message.get("kind", "start") == "start":
            return text
        transcript = self.environ.get("DEVPILOT_TRANSCRIPT")
        earlier = (
            f" (every message and reply so far, as JSON lines, is in {transcript})" if transcript else ""
        )
        return f"This continues a conversation from Linear{earlier}. The person now says:\n\n{text}"

    def _argv(self, cli: str, resume: str | None) -> list[str]:
        resuming = ["--resume", resume] if resume else []
        return [cli, *STREAM, "--permission-prompt-tool", "stdio", *resuming, *self.agent_args]

    def _env(self) -> dict[str, str]:
        # The agent runs code it did not write: the token that speaks in Linear stays with the runner.
        env = {k: v for k, v in self.environ.items() if k != "DEVPILOT_AGENT_TOKEN"}
        # The CLI keeps its to-do list (the plan in Linear) with these tools: some models have them off.
        env.setdefault("CLAUDE_CODE_ENABLE_TODO_TOOLS", "1")
        return env

    def _session(self, cli: str, first: str, resume: str | None) -> int | None:
        """One CLI process, until it ends. None: it could not resume `resume` (start a new one)."""
        try:
            self.proc = child.start(self._argv(cli, resume), self._env(), self.workdir)
        except OSError as exc:
            self.narrator.fail(f"Claude Code (`{cli}`) could not be started: {exc}")
            return 1
        self._turn(first)
        while True:
            alive = self._pump(0.2)
            if resume is not None and not self.started and self.result is not None:
                self._close(grace=2.0)
                print(
                    f"devpilot-agent claude: session {resume} cannot be resumed; starting a new one",
                    file=sys.stderr,
                )
                self._forget_session()
                return None
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

    def _ended(self) -> int:
        assert self.proc is not None
        code = self.proc.wait()
        if self.stopping:
            self.narrator.flush()
            return 0
        result = self.result
        if result is not None and not result.is_error:
            self.narrator.finish(result.text)
            return 0
        if result is not None:
            self._fail(self._explain(result))
            return 1
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = "\n".join(self.stderr_tail).strip()
        self._fail(
            f"Claude Code {how} before it finished." + (f"\n\n```\n{tail[-1500:]}\n```" if tail else "")
        )
        return 1

    def _fail(self, reason: str) -> None:
        """The run failed: Linear hears why, once."""
        if not self.failed:
            self.failed = True
            self.narrator.fail(reason)

    def _explain(self, result: Result) -> str:
        reason = result.reason
        if "Not logged in" in reason or "/login" in reason:
            return (
                f"Claude Code has no credentials on this machine ({reason}). Give it an API key with "
                "`--pass-env ANTHROPIC_API_KEY` on the orchestrator, or log in with `claude` as the "
                "user the orchestrator runs as."
            )
        if result.api_status in REFUSED:
            return f"The model's API refused Claude Code's credentials (HTTP {result.api_status}): {reason}"
        return f"Claude Code could not finish: {reason}"

    # --- its output ------------------------------------------------------------------------------
    def _pump(self, timeout: float) -> bool:
        """Read what the CLI wrote (waiting up to `timeout`); False once its stdout is closed."""
        assert self.proc is not None and self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        open_fds = [fd for fd, live in ((out, self._out_open), (err, self._err_open)) if live]
        if not open_fds:
            return False
        try:
            readable, _, _ = select.select(open_fds, [], [], timeout)
        except InterruptedError:  # (a signal: the loop looks at it)
            return True
        for fd in readable:
            chunk = os.read(fd, 1 << 16)
            if fd == err:
                self._stderr(chunk)
            elif not chunk:
                self._out_open = False
            else:
                self._stdout(chunk)
        return self._out_open

    def _stdout(self, chunk: bytes) -> None:
        self._out += chunk
        *lines, self._out = self._out.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                self._stderr(line + b"\n")
                continue
            if isinstance(event, dict):
                self.last_event = time.monotonic()
                for effect in self.stream.feed(event):
                    self._effect(effect)
                self._keep_state()

    def _stderr(self, chunk: bytes) -> None:
        if not chunk:
            self._err_open = False
            return
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        self._err += chunk
        *lines, self._err = self._err.split(b"\n")
        self.stderr_tail.extend(line.decode("utf-8", "replace") for line in lines)

    def _effect(self, effect: Effect) -> None:
        if isinstance(effect, Init):
            self.started = True
        elif isinstance(effect, TurnEnded):
            self.open_turns.discard(effect.uuid)
        elif isinstance(effect, Result):
            self.result = effect
            if effect.is_error and not self.stopping and (self.started or self.resume_id is None):
                self._fail(self._explain(effect))
        elif isinstance(effect, Permission):
            if self.stopping:
                self._deny(effect, "Linear asked the agent to stop.")
            else:
                self.asks.append(Ask(effect, time.monotonic() + self.options.approval_timeout))
                self._post_ask()
        elif isinstance(effect, Cancelled):
            self.asks = deque(a for a in self.asks if a.permission.request_id != effect.request_id)
            self._post_ask()
        elif isinstance(effect, Unsupported):
            self._send(
                {
                    "type": "control_response",
                    "response": {
                        "subtype": "error",
                        "request_id": effect.request_id,
                        "error": f"devpilot-agent does not serve {effect.subtype} requests",
                    },
                }
            )
        elif isinstance(effect, Retry):
            if effect.status in REFUSED and not self.stopping:
                self._fail(
                    f"The model's API refused Claude Code's credentials (HTTP {effect.status}, "
                    f"{effect.error or 'refused'}): check the API key the orchestrator passes with "
                    "`--pass-env ANTHROPIC_API_KEY`, or the CLI's login."
                )
            elif not self.failed and not self.stopping:
                self.narrator.note(
                    f"The model's API is failing ({effect.status or effect.error or 'no answer'}); Claude Code tries "
                    f"again (attempt {effect.attempt} of {effect.of}).",
                    ephemeral=True,
                )

    def _keep_state(self) -> None:
        state = {"sessionId": self.stream.session_id or self.resume_id, "tasks": self.stream.tasks}
        if not state["sessionId"]:
            return
        text = json.dumps(state, sort_keys=True)
        if text != self._saved:
            self.store.save(state)
            self._saved = text

    def _forget_session(self) -> None:
        self.resume_id = None
        self.stream.session_id = None
        self.store.save({"tasks": self.stream.tasks})
        self._saved = ""

    # --- its input -------------------------------------------------------------------------------
    def _send(self, line: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):  # (it ended: the loop sees its stdout close)
            self.proc.stdin.write((json.dumps(line) + "\n").encode())
            self.proc.stdin.flush()

    def _turn(self, text: str) -> None:
        """A user turn; the CLI reports it done (`command_lifecycle`) by its uuid."""
        turn = str(uuid.uuid4())
        self.open_turns.add(turn)
        self.result = None
        self._send(
            {
                "type": "user",
                "message": {"role": "user", "content": text},
                "parent_tool_use_id": None,
                "session_id": self.stream.session_id or "",
                "uuid": turn,
            }
        )

    def _follow_ups(self) -> None:
        """Each follow-up in the inbox: the answer to what the agent asked, else its next user turn."""
        while (found := self.inbox.oldest()) is not None:
            path, message = found
            prompt = message.get("prompt") or {}
            body = str(prompt.get("body") or (prompt.get("signalMetadata") or {}).get("value") or "").strip()
            if self.asks:
                self._answer(body)
            else:
                if self.result is not None and not self.result.is_error:
                    self.narrator.turn_done(self.result.text)  # (not the session's last word)
                self._turn(body or "Continue.")
            Inbox.taken(path)

    def _finished(self) -> bool:
        """Every turn written is done, nothing is asked, nothing waits: time to end."""
        if self.result is None or self.asks or self.inbox.waiting():
            return False
        return not self.open_turns or time.monotonic() - self.last_event > QUIET_AFTER_RESULT

    def _close(self, grace: float) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        while self._pump(0.1) and self.proc.poll() is None:
            if time.monotonic() - self.last_event > grace:
                break
        child.end(self.proc, grace=1.0)

    def _stop(self) -> int:
        """Linear's stop: the protocol's interrupt, a moment for the CLI to end its turn, then
        stdin closed and the CLI ended (its session saved: a later follow-up resumes it)."""
        self._send(
            {
                "type": "control_request",
                "request_id": f"devpilot-stop-{uuid.uuid4()}",
                "request": {"subtype": "interrupt"},
            }
        )
        self.result = None
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline and self.result is None and self._pump(0.1):
            pass
        assert self.proc is not None and self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline and self._pump(0.1):
            pass
        child.end(self.proc, grace=0.0)
        self.narrator.flush()
        return 0

    # --- asking the person -----------------------------------------------------------------------
    def _post_ask(self) -> None:
        """Post the oldest waiting ask to Linear, if not yet (one at a time: answers come in order)."""
        if not self.asks or self.asks[0].posted:
            return
        ask = self.asks[0]
        ask.posted = True
        p = ask.permission
        question = ask.question
        if question is not None:
            options = [str(o.get("label")) for o in question.get("options") or [] if isinstance(o, dict)]
            notes = "\n".join(
                f"- **{o.get('label')}**: {o.get('description')}"
                for o in question.get("options") or []
                if isinstance(o, dict) and o.get("description")
            )
            self.narrator.ask(
                str(question.get("question") or "") + (f"\n\n{notes}" if notes else ""), options
            )
        elif p.tool == "ExitPlanMode":
            self.narrator.ask(
                f"Claude Code has a plan and asks to start:\n\n{p.input.get('plan', '')}", [ALLOW, DENY]
            )
        else:
            what = one_line(parameter(p.tool, p.input, self.workdir))
            why = f" ({p.description})" if p.description and p.description != what else ""
            shown = f": `{what}`" if what else ""
            self.narrator.ask(f"Claude Code asks to use **{p.tool}**{shown}{why}. Allow it?", [ALLOW, DENY])

    def _answer(self, said: str) -> None:
        ask = self.asks[0]
        question = ask.question
        if question is not None:
            labels = [str(o.get("label")) for o in question.get("options") or [] if isinstance(o, dict)]
            picked = next((label for label in labels if label.lower() == said.lower()), said)
            ask.answers[str(question.get("question") or "")] = picked
            if ask.question is not None:  # the next question of the same call
                ask.posted = False
                self._post_ask()
                return
            self.asks.popleft()
            picks = "; ".join(f"{q} {a}" for q, a in ask.answers.items())
            self.narrator.note(f"Answered in Linear: {picks}", ephemeral=True)
            self._allow(ask.permission, {**ask.permission.input, "answers": ask.answers})
        else:
            self.asks.popleft()
            word = said.lower().strip(" .!")
            p = ask.permission
            what = f"{p.tool} `{one_line(parameter(p.tool, p.input, self.workdir))}`"
            # (said in Linear at once: the person sees the agent took the answer; the page keeps it)
            if word in YES:
                self.narrator.note(f"Allowed in Linear: {what}", ephemeral=True)
                self._allow(p, p.input)
            elif word in NO:
                self.narrator.note(f"Denied in Linear: {what}", ephemeral=True)
                self._deny(p, "Denied by the person in Linear.")
            else:
                self.narrator.note(f"Not allowed in Linear: {what}", ephemeral=True)
                self._deny(p, f"Not allowed; the person said in Linear: {said}")
        self._post_ask()

    def _asks_due(self) -> None:
        t = self.options.approval_timeout
        waited = f"{t:g} seconds" if t < 120 else f"{t / 60:.0f} minutes"
        while self.asks and self.asks[0].posted and time.monotonic() >= self.asks[0].deadline:
            ask = self.asks.popleft()
            if ask.permission.questions:
                self.narrator.note(f"No answer within {waited}: going on without it.")
                self._deny(
                    ask.permission,
                    f"The person did not answer within {waited}; go on with your best judgement.",
                )
            else:  # (the denied call shows as the action's result)
                self._deny(ask.permission, f"No answer in Linear within {waited}: not allowed.")
            self._post_ask()

    def _allow(self, p: Permission, given: dict[str, Any]) -> None:
        self._respond(p, {"behavior": "allow", "updatedInput": given})

    def _deny(self, p: Permission, why: str) -> None:
        self._respond(p, {"behavior": "deny", "message": why})

    def _respond(self, p: Permission, decision: dict[str, Any]) -> None:
        self._send(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": p.request_id, "response": decision},
            }
        )
