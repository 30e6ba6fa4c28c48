"""`devpilot-agent codex [CODEX_ARG]...`: Codex (the `codex` CLI) on the conversation's message,
live in Linear.

The CLI runs as `codex app-server` (JSON-RPC over its stdin and stdout, the protocol of Codex's
own IDE extensions) in `DEVPILOT_WORKDIR`: `codex exec --json` cannot take input while it works
nor ask before it acts, the app-server can. Its first turn (`turn/start`) is the request (on a
start Linear's promptContext, with the team's guidance); a follow-up that reaches the inbox while
a turn runs is steered into it (`turn/steer`: the model's next request carries it), one that comes
between turns starts the next (`turn/start`). The thread id is kept in the conversation's folder
(`orchestrator.runners.store`): the conversation's next COMMAND resumes it (`thread/resume`, from
the history codex keeps in CODEX_HOME). When no turn runs, nothing is asked and nothing waits,
stdin is closed, the app-server exits, and the agent's last message is the `response`.

Approvals are the app-server's requests to its client (`item/commandExecution/requestApproval`,
`item/fileChange/requestApproval`): each is an `elicitation` with Linear's `select` (Allow /
Deny), answered `accept` or `decline` with the person's pick; no answer within
`--approval-timeout` declines it. By default codex runs sandboxed (`workspace-write`: it edits the
working directory, no network) and asks before anything beyond (`on-request`); the person's own
`-c` overrides come after the defaults, so they win.

Linear's stop is SIGTERM: the runner interrupts the turn (`turn/interrupt`), closes stdin, and the
app-server ends with its thread saved. A CLI missing from PATH, the model's API refusing the
credentials (or unreachable past `--model-api-timeout`: codex itself would retry forever), or an
app-server that ends mid-turn is an `error` naming the cause.
"""

from __future__ import annotations

import itertools
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.runners.asks import ALLOW, DENY, Ask, Question, choice, in_words
from orchestrator.runners.codex_events import (
    Approval,
    CodexEvents,
    Effect,
    Resolved,
    Retrying,
    TurnEnded,
    TurnStarted,
    Unsupported,
)
from orchestrator.runners.narrator import one_line
from orchestrator.runners.runner import Options, Runner, host

PINNED = "0.171.0"  # the version this runner is tested with (tests/fixtures/codex/)
# Codex's defaults for a run from Linear: sandboxed, asking before anything beyond the sandbox,
# its to-do list on (off by default in 0.171.0; it is the session's plan). The person's -c come after.
DEFAULTS = [
    "-c",
    'sandbox_mode="workspace-write"',
    "-c",
    'approval_policy="on-request"',
    "-c",
    "tools.update_plan.enabled=true",
]
# The npm package's `codex` is a node launcher that spawns (on Node < 22.15) the native binary of the
# platform's package, which the launcher's SIGKILL leaves running: the runner starts the binary
# itself, so it gets the runner's signals and dies with it (child.py).
NATIVE = {
    ("Linux", "x86_64"): ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    ("Linux", "aarch64"): ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
    ("Darwin", "x86_64"): ("codex-darwin-x64", "x86_64-apple-darwin"),
    ("Darwin", "arm64"): ("codex-darwin-arm64", "aarch64-apple-darwin"),
}
CALL_WAIT = 60.0  # seconds for the app-server to answer a request of the runner's
REFUSED = (401, 403)  # the model's API refusing the key: retrying will not help
RETRY_NOTE_EVERY = 60.0  # seconds between the notes that the model's API is failing


def run(agent_args: list[str], options: Options) -> int:
    return host(Codex, agent_args, options)


def native(cli: str) -> tuple[str, dict[str, str]]:
    """The binary to start for the `codex` found on PATH, and what its launcher would have added
    to the environment: the npm package's native binary, else `cli` itself."""
    real = Path(os.path.realpath(cli))
    found = NATIVE.get((platform.system(), platform.machine()))
    if real.name != "codex.js" or found is None:
        return cli, {}
    package, triple = found
    root = real.parent.parent  # .../node_modules/@openai/codex
    for vendor in (root / "node_modules" / "@openai" / package, root.parent / package, root):
        binary = vendor / "vendor" / triple / "bin" / "codex"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary), {"CODEX_MANAGED_BY_NPM": "1", "CODEX_MANAGED_PACKAGE_ROOT": str(root)}
    return cli, {}


class Codex(Runner[Approval]):
    name, title, command = "codex", "Codex", "codex"
    install = f"npm install -g @openai/codex@{PINNED}"

    def prepare(self) -> None:
        saved = self.store.load().get("threadId")
        self.thread_id: str | None = saved if isinstance(saved, str) else None
        self.events = CodexEvents(self.narrator, self.workdir)
        self.turn_id: str | None = None  # the turn running now
        self.ended: TurnEnded | None = None  # how the last turn ended, while no newer one started
        self._ids = itertools.count(1)
        self._awaited: set[int] = set()
        self._answers: dict[int, dict[str, Any]] = {}
        self._retry_noted = 0.0
        self.refusal = ""  # why codex refused a turn, as it said

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        cli = self.cli()
        if cli is None:
            return 1
        self.hear_stop()
        binary, launcher_env = native(cli)
        if not self._start(
            [binary, "app-server", *DEFAULTS, *self.agent_args], {**self.agent_env(), **launcher_env}
        ):
            return 1
        if self._begin():
            return self.work()
        self._close(grace=2.0)  # (it may still run: it refused what it was asked)
        return self._ended()

    def _begin(self) -> bool:
        """The app-server initialized, the thread started or resumed, the first turn started."""
        if self._call("initialize", {"clientInfo": {"name": "devpilot_agent", "version": PINNED}}) is None:
            return False
        assert self.lines is not None
        self.lines.send({"method": "initialized"})
        resuming = False
        if self.thread_id is not None:
            answer = self._call("thread/resume", {"threadId": self.thread_id, "cwd": str(self.workdir)})
            if answer is None:
                return False
            resuming = "result" in answer
            if not resuming:
                why = (answer.get("error") or {}).get("message")
                print(
                    f"devpilot-agent codex: thread {self.thread_id} cannot be resumed ({why}); starting a new one",
                    file=sys.stderr,
                )
        if not resuming:
            answer = self._call("thread/start", {"cwd": str(self.workdir)})
            thread = ((answer or {}).get("result") or {}).get("thread") or {}
            if not thread.get("id"):
                if answer is not None:
                    self.fail(f"Codex could not start a thread: {(answer.get('error') or {}).get('message')}")
                return False
            self.thread_id = str(thread["id"])
            self.store.save({"threadId": self.thread_id})
        if self._tell(self.first_turn(resuming=resuming)):
            return True
        if self.refusal:
            self.fail(f"Codex did not take the request: {self.refusal}")
        return False

    def _answer(self) -> str | None:
        """The last turn's last message, once what came before it is said."""
        if self.ended is None or self.ended.status != "completed":
            return None
        self.narrator.flush()
        return self.events.answer()

    def _explain(self, ended: TurnEnded) -> str:
        status, error = ended.http_status, ended.error or "the turn failed"
        if status in REFUSED:
            return (
                f"The model's API refused Codex's credentials (HTTP {status}): {error}. Check the API key "
                "the orchestrator passes with `--pass-env`, or sign in with `codex login` as the user the "
                "orchestrator runs as."
            )
        if "Missing environment variable" in error:
            return f"Codex could not finish: {error} Pass it to the agent with `--pass-env NAME` on the orchestrator."
        return f"Codex could not finish: {error}" + (f" (HTTP {status})" if status else "")

    def _check(self) -> None:
        """Codex retries a model API it cannot reach forever: the run ends after --model-api-timeout."""
        since = self.events.retrying_since
        if since is None or self.stopping or time.monotonic() - since < self.options.model_api_timeout:
            return
        self._interrupt()
        waited = in_words(self.options.model_api_timeout)
        self.fail(
            f"The model's API has not answered Codex for {waited} (codex retries it without end); the "
            "run is stopped. Check the machine's network and the model provider's address, then reply "
            "here to go on."
        )

    # --- JSON-RPC ----------------------------------------------------------------------------------
    def _pump(self, timeout: float) -> bool:
        """Read what the app-server wrote (waiting up to `timeout`); False once its stdout is closed."""
        assert self.lines is not None
        for message in self.lines.read(timeout):
            self.last_event = time.monotonic()
            answered = message.get("id")
            if "method" not in message and isinstance(answered, int) and answered in self._awaited:
                self._awaited.discard(answered)
                self._answers[answered] = message
                continue
            for effect in self.events.feed(message):
                self._effect(effect)
        return self.lines.open

    def _request(self, method: str, params: dict[str, Any]) -> int:
        assert self.lines is not None
        request_id = next(self._ids)
        self._awaited.add(request_id)
        self.lines.send({"id": request_id, "method": method, "params": params})
        return request_id

    def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """A request and its answer (`result` or `error`), what else codex says meanwhile handled;
        None when the app-server ended (or said nothing in time)."""
        request_id = self._request(method, params)
        deadline = time.monotonic() + CALL_WAIT
        while request_id not in self._answers:
            if not self._pump(0.1) or time.monotonic() > deadline:
                return None
        return self._answers.pop(request_id)

    def _reply(self, request_id: int | str, result: dict[str, Any]) -> None:
        assert self.lines is not None
        self.lines.send({"id": request_id, "result": result})

    def _effect(self, effect: Effect) -> None:
        if isinstance(effect, TurnStarted):
            self.turn_id = effect.turn_id
        elif isinstance(effect, TurnEnded):
            if self.turn_id in (None, effect.turn_id):
                self.turn_id = None
                self.ended = effect
            if effect.status == "failed" and not self.stopping:
                self.fail(self._explain(effect))
        elif isinstance(effect, Approval):
            self._asked(effect)
        elif isinstance(effect, Resolved):
            self.asks.withdraw(lambda a: a.request_id == effect.request_id)
        elif isinstance(effect, Unsupported):
            assert self.lines is not None
            error = {"code": -32601, "message": f"devpilot-agent does not serve {effect.method}"}
            self.lines.send({"id": effect.request_id, "error": error})
        elif isinstance(effect, Retrying):
            if effect.http_status in REFUSED and not self.stopping:
                self._interrupt()
                self.fail(self._explain(TurnEnded("", "failed", effect.message, effect.http_status)))
            elif (
                not self.failed
                and not self.stopping
                and time.monotonic() - self._retry_noted > RETRY_NOTE_EVERY
            ):
                self._retry_noted = time.monotonic()
                self.narrator.note(
                    f"The model's API is failing ({effect.message}); Codex tries again.", ephemeral=True
                )

    # --- turns -------------------------------------------------------------------------------------
    def _tell(self, text: str) -> bool:
        """The person's words to the agent: into the running turn, else as the next turn. False when
        codex did not take them."""
        words = [{"type": "text", "text": text}]
        if self.turn_id is not None:
            steer = {"threadId": self.thread_id, "expectedTurnId": self.turn_id, "input": words}
            answer = self._call("turn/steer", steer)
            if answer is None:
                return False
            if "result" in answer:
                return True
            # (no active turn to steer: it has just ended; a new one)
        if self.ended is not None and self.ended.status == "completed":
            self.narrator.turn_done(self.events.answer())  # (not the session's last word)
        answer = self._call("turn/start", {"threadId": self.thread_id, "input": words})
        turn = ((answer or {}).get("result") or {}).get("turn") or {}
        if not turn.get("id"):
            self.refusal = str(((answer or {}).get("error") or {}).get("message") or "")
            print(f"devpilot-agent codex: codex took no turn: {answer}", file=sys.stderr)
            return False
        if self.ended is None or self.ended.turn_id != turn["id"]:  # (not over already: it may be quick)
            self.turn_id, self.ended = str(turn["id"]), None
        return True

    def _interrupt(self) -> None:
        if self.turn_id is not None:
            self._request("turn/interrupt", {"threadId": self.thread_id, "turnId": self.turn_id})

    def _finished(self) -> bool:
        """No turn runs, nothing is asked, nothing waits: time to end."""
        return self.turn_id is None and self.ended is not None and not self.asks and not self.inbox.waiting()

    def _interrupted(self) -> bool:
        return self.turn_id is None

    # --- asking the person -----------------------------------------------------------------------
    def _questions(self, a: Approval) -> list[Question]:
        why = f" ({a.reason})" if a.reason else ""
        if a.questions:
            return [choice(str(q.get("question") or ""), q.get("options") or []) for q in a.questions]
        if a.method.startswith("item/fileChange"):
            return [Question(f"Codex asks to change **{a.what}**{why}. Allow it?", [ALLOW, DENY])]
        return [Question(f"Codex asks to run `{one_line(a.what)}`{why}. Allow it?", [ALLOW, DENY])]

    def _answered(self, ask: Ask[Approval], words: str) -> None:
        a = ask.request
        if a.questions:
            answers = {
                str(q.get("id")): {"answers": [pick]}
                for q, pick in zip(a.questions, ask.answers, strict=True)
            }
            self.narrator.note(f"Answered in Linear: {'; '.join(ask.answers)}", ephemeral=True)
            self._reply(a.request_id, {"answers": answers})
        else:
            allowed, why = self._verdict(f"`{one_line(a.what)}`", ask.answers[0], words)
            if allowed:
                self._reply(a.request_id, {"decision": "accept"})
            else:
                self._refuse(a, why)
            if allowed is None:  # (the person's words reach the agent as theirs)
                self._tell(words)

    def _unanswered(self, ask: Ask[Approval]) -> None:
        if ask.request.questions:
            self.narrator.note(f"No answer within {self.asks.waited}: going on without it.")
        # (a declined call shows why as its action's result)
        self._refuse(ask.request, f"No answer in Linear within {self.asks.waited}: not allowed.")

    def _refuse(self, a: Approval, why: str) -> None:
        """Declined (a question: answered with nothing); `why` is shown as the action's result."""
        if a.questions:
            self._reply(a.request_id, {"answers": {}})
            return
        self.events.declined[a.item_id] = why
        self._reply(a.request_id, {"decision": "decline"})
