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

import json
import sys
import time
import uuid
from typing import Any

from orchestrator.runners.asks import ALLOW, DENY, Ask, Asks, Question, choice
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
from orchestrator.runners.narrator import one_line
from orchestrator.runners.runner import Options, Runner, host

PINNED = "2.1.332"  # the version this runner is tested with (tests/fixtures/claude/)
STREAM = ["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
QUIET_AFTER_RESULT = 5.0  # seconds: a turn the CLI never reports done (an older CLI) counts as done
REFUSED = (401, 403)  # the model's API refusing the key: retrying will not help


class StartAnew(Exception):
    """The session to resume is gone (pruned by the CLI): a new one starts."""


def run(agent_args: list[str], options: Options) -> int:
    return host(Claude, agent_args, options)


class Claude(Runner[Permission]):
    name, title, command = "claude", "Claude Code", "claude"
    install = f"npm install -g @anthropic-ai/claude-code@{PINNED}"

    def prepare(self) -> None:
        saved = self.store.load()
        self.resume_id = saved.get("sessionId") if isinstance(saved.get("sessionId"), str) else None
        tasks = saved.get("tasks")
        self.stream = ClaudeStream(
            self.narrator, self.workdir, tasks=dict(tasks) if isinstance(tasks, dict) else {}
        )
        self._saved = json.dumps(saved, sort_keys=True)
        self._reset()

    def _reset(self) -> None:
        self.proc = None
        self.lines = None
        self.open_turns: set[str] = set()
        self.result: Result | None = None  # the last turn's, while no newer turn was written
        self.asks = Asks(self.narrator, self.options.approval_timeout)
        self.failed = False
        self.started = False  # the CLI said init
        self.last_event = time.monotonic()

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        cli = self.cli()
        if cli is None:
            return 1
        self.hear_stop()
        first = self.first_turn(resuming=self.resume_id is not None)
        code = self._session(cli, first, self.resume_id)
        if code is None:  # the session to resume is gone (pruned by the CLI): a new one
            self._reset()
            code = self._session(cli, self.first_turn(resuming=False), None) or 0
        return code

    def _argv(self, cli: str, resume: str | None) -> list[str]:
        resuming = ["--resume", resume] if resume else []
        return [cli, *STREAM, "--permission-prompt-tool", "stdio", *resuming, *self.agent_args]

    def _env(self) -> dict[str, str]:
        env = self.agent_env()
        # The CLI keeps its to-do list (the plan in Linear) with these tools: some models have them off.
        env.setdefault("CLAUDE_CODE_ENABLE_TODO_TOOLS", "1")
        return env

    def _session(self, cli: str, first: str, resume: str | None) -> int | None:
        """One CLI process, until it ends. None: it could not resume `resume` (start a new one)."""
        if not self._start(self._argv(cli, resume), self._env()):
            return 1
        self._turn(first)
        try:
            return self.work()
        except StartAnew:
            return None

    def _check(self) -> None:
        """A session the CLI could not resume (it said no init, only an error): it is forgotten."""
        if self.resume_id is not None and not self.started and self.result is not None:
            self._close(grace=2.0)
            print(
                f"devpilot-agent claude: session {self.resume_id} cannot be resumed; starting a new one",
                file=sys.stderr,
            )
            self._forget_session()
            raise StartAnew

    def _answer(self) -> str | None:
        return self.result.text if self.result is not None and not self.result.is_error else None

    def _failure(self) -> str | None:
        return self._explain(self.result) if self.result is not None else None

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
        assert self.lines is not None
        for event in self.lines.read(timeout):
            self.last_event = time.monotonic()
            for effect in self.stream.feed(event):
                self._effect(effect)
            self._keep_state()
        return self.lines.open

    def _effect(self, effect: Effect) -> None:
        if isinstance(effect, Init):
            self.started = True
        elif isinstance(effect, TurnEnded):
            self.open_turns.discard(effect.uuid)
        elif isinstance(effect, Result):
            self.result = effect
            if effect.is_error and not self.stopping and (self.started or self.resume_id is None):
                self.fail(self._explain(effect))
        elif isinstance(effect, Permission):
            self._asked(effect)
        elif isinstance(effect, Cancelled):
            self.asks.withdraw(lambda p: p.request_id == effect.request_id)
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
                self.fail(
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
        assert self.lines is not None
        self.lines.send(line)

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

    def _tell(self, text: str) -> bool:
        """The next user turn (the last one's text was not the session's last word)."""
        if self.result is not None and not self.result.is_error:
            self.narrator.turn_done(self.result.text)
        self._turn(text)
        return True

    def _finished(self) -> bool:
        """Every turn written is done, nothing is asked, nothing waits: time to end."""
        if self.result is None or self.asks or self.inbox.waiting():
            return False
        return not self.open_turns or time.monotonic() - self.last_event > QUIET_AFTER_RESULT

    def _interrupt(self) -> None:
        """The protocol's interrupt: the CLI ends its turn with a result."""
        self._send(
            {
                "type": "control_request",
                "request_id": f"devpilot-stop-{uuid.uuid4()}",
                "request": {"subtype": "interrupt"},
            }
        )
        self.result = None

    def _interrupted(self) -> bool:
        return self.result is not None

    # --- asking the person -----------------------------------------------------------------------
    def _questions(self, p: Permission) -> list[Question]:
        """What Linear asks the person: each question of AskUserQuestion (its options as the
        select), or whether the tool may run."""
        if p.questions:
            return [choice(str(q.get("question") or ""), q.get("options") or []) for q in p.questions]
        if p.tool == "ExitPlanMode":
            return [
                Question(
                    f"Claude Code has a plan and asks to start:\n\n{p.input.get('plan', '')}", [ALLOW, DENY]
                )
            ]
        what = one_line(parameter(p.tool, p.input, self.workdir))
        why = f" ({p.description})" if p.description and p.description != what else ""
        shown = f": `{what}`" if what else ""
        return [Question(f"Claude Code asks to use **{p.tool}**{shown}{why}. Allow it?", [ALLOW, DENY])]

    def _answered(self, ask: Ask[Permission], words: str) -> None:
        p = ask.request
        if p.questions:
            answers = {str(q.get("question") or ""): a for q, a in zip(p.questions, ask.answers, strict=True)}
            picks = "; ".join(f"{q} {a}" for q, a in answers.items())
            self.narrator.note(f"Answered in Linear: {picks}", ephemeral=True)
            self._allow(p, {**p.input, "answers": answers})
        else:
            what = f"{p.tool} `{one_line(parameter(p.tool, p.input, self.workdir))}`"
            allowed, why = self._verdict(what, ask.answers[0], words)
            if allowed:
                self._allow(p, p.input)
            else:
                self._refuse(p, why)

    def _unanswered(self, ask: Ask[Permission]) -> None:
        waited = self.asks.waited
        if ask.request.questions:
            self.narrator.note(f"No answer within {waited}: going on without it.")
            self._refuse(
                ask.request, f"The person did not answer within {waited}; go on with your best judgement."
            )
        else:  # (the denied call shows as the action's result)
            self._refuse(ask.request, f"No answer in Linear within {waited}: not allowed.")

    def _allow(self, p: Permission, given: dict[str, Any]) -> None:
        self._respond(p, {"behavior": "allow", "updatedInput": given})

    def _refuse(self, p: Permission, why: str) -> None:
        self._respond(p, {"behavior": "deny", "message": why})

    def _respond(self, p: Permission, decision: dict[str, Any]) -> None:
        self._send(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": p.request_id, "response": decision},
            }
        )
