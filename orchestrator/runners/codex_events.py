"""Codex's app-server notifications and requests, mapped to what Linear shows (as recorded from the
pinned version, 0.171.0; its fixtures are tests/fixtures/codex/).

The app-server speaks JSON-RPC, one object a line: notifications (`method`, `params`), the
server's requests to its client (`id` too: approvals, questions), and answers to the client's own
requests (the runner's business). Of the notifications:
- `item/started` / `item/completed` carry a thread item: `agentMessage` (the agent's words: a
  `thought`, the turn's last one its answer), `reasoning` (its `summary`: a `thought`),
  `commandExecution` (an `action`: the command run, its `aggregatedOutput` the result),
  `fileChange` (an `action`: the paths changed, each with its diff), `mcpToolCall`, `webSearch`,
  `dynamicToolCall`, `imageView` (actions too);
- `turn/plan/updated` is the agent's to-do list (`pending`, `inProgress`, `completed`: Linear's
  words): the session's plan;
- `error` says the model's API failed (`willRetry`: codex tries again, forever when the API cannot
  be reached; `codexErrorInfo` may hold the HTTP status);
- `turn/started`, `turn/completed` (`status`: `completed`, `interrupted`, `failed` with `error`);
- `serverRequest/resolved`: a request to the client is no longer awaited.
Deltas (`item/agentMessage/delta`, `…/outputDelta`), token usage and rate limits are not shown:
each item is shown once it is complete.
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.runners.narrator import Narrator

PLAN_STATUS = {"pending": "pending", "inProgress": "inProgress", "completed": "completed"}
SHELLS = frozenset({"bash", "sh", "zsh", "dash"})
CHANGE = {"add": "Create", "delete": "Delete", "update": "Edit"}
APPROVALS = ("item/commandExecution/requestApproval", "item/fileChange/requestApproval")
QUESTION = "item/tool/requestUserInput"
UNFINISHED = "(still running when the turn ended)"


@dataclass(frozen=True)
class Approval:
    """Codex asks whether a command may run or files may change (or, with `questions`, the
    person's answers to its questions: `item/tool/requestUserInput`)."""

    request_id: int | str
    method: str
    item_id: str
    what: str  # the command, or the paths
    reason: str = ""
    questions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Unsupported:
    """A request to the client that this host does not serve: answered with a JSON-RPC error."""

    request_id: int | str
    method: str


@dataclass(frozen=True)
class Resolved:
    """Codex no longer awaits the answer to this request (answered, or the turn ended)."""

    request_id: int | str


@dataclass(frozen=True)
class TurnStarted:
    turn_id: str


@dataclass(frozen=True)
class TurnEnded:
    turn_id: str
    status: str  # completed, interrupted, failed
    error: str = ""
    http_status: int | None = None


@dataclass(frozen=True)
class Retrying:
    """The model's API failed and codex tries again."""

    message: str
    http_status: int | None


Effect = Approval | Unsupported | Resolved | TurnStarted | TurnEnded | Retrying


def command_text(command: str) -> str:
    """The command as the agent wrote it: codex runs it as `/bin/bash -lc '…'`."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) == 3 and os.path.basename(words[0]) in SHELLS and words[1] in ("-c", "-lc"):
        return words[2]
    return command


def http_status(error: dict[str, Any]) -> int | None:
    """The HTTP status in an error's `codexErrorInfo` (`{"httpConnectionFailed": {"httpStatusCode":
    401}}` and its like), if any."""
    info = error.get("codexErrorInfo")
    if isinstance(info, dict):
        for detail in info.values():
            status = detail.get("httpStatusCode") if isinstance(detail, dict) else None
            if isinstance(status, int):
                return status
    return None


def diff_size(diff: str) -> str:
    """`+added -removed` of a change's diff: its hunks (codex gives no file headers), or for a new
    file its content, all added."""
    lines = diff.splitlines()
    if not any(line.startswith("@@") for line in lines):
        return f"+{len(lines)}"
    added = sum(1 for line in lines if line.startswith("+"))
    removed = sum(1 for line in lines if line.startswith("-"))
    return f"+{added} -{removed}"


@dataclass
class CodexEvents:
    narrator: Narrator
    workdir: Path | None = None
    declined: dict[str, str] = field(default_factory=dict)  # item id -> why the runner declined it
    retrying_since: float | None = None  # the model's API has failed since (monotonic), unanswered
    _items: dict[str, dict[str, Any]] = field(default_factory=dict)  # started, not completed
    _said: str | None = None  # the agent's latest message: a thought, or the turn's answer

    def feed(self, message: dict[str, Any]) -> list[Effect]:
        method = str(message.get("method") or "")
        given = message.get("params")
        params: dict[str, Any] = given if isinstance(given, dict) else {}
        if "id" in message and method:
            return [self._request(message["id"], method, params)]
        if method.startswith("item/"):
            self.retrying_since = None  # (the model answers)
        if method == "item/started":
            self._started(params.get("item") or {})
        elif method == "item/completed":
            self._completed(params.get("item") or {})
        elif method == "turn/plan/updated":
            steps = [s for s in params.get("plan") or [] if isinstance(s, dict)]
            self.narrator.plan(
                [
                    {
                        "content": str(s.get("step") or ""),
                        "status": PLAN_STATUS.get(str(s.get("status")), "pending"),
                    }
                    for s in steps
                ]
            )
        elif method == "turn/started":
            return [TurnStarted(str((params.get("turn") or {}).get("id") or ""))]
        elif method == "turn/completed":
            return [self._turn_ended(params.get("turn") or {})]
        elif method == "error" and params.get("willRetry"):
            error = params.get("error") or {}
            self.retrying_since = self.retrying_since or time.monotonic()
            detail = str(error.get("additionalDetails") or "")
            said = str(error.get("message") or "") + (f" ({detail})" if detail else "")
            return [Retrying(said, http_status(error))]
        elif method == "serverRequest/resolved" and "requestId" in params:
            return [Resolved(params["requestId"])]
        return []

    def answer(self) -> str:
        """The turn's answer (the agent's last message), taken: the runner posts it."""
        said, self._said = self._said or "", None
        return said

    # --- items ---------------------------------------------------------------------------------
    def _started(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind in ("userMessage", "agentMessage", "reasoning"):
            return
        self._release()
        item_id = str(item.get("id") or "")
        self._items[item_id] = item
        shown = self._action(item)
        if shown is not None:
            self.narrator.action_started(item_id, *shown)

    def _completed(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        item_id = str(item.get("id") or "")
        if kind == "agentMessage":
            self._release()
            self._said = str(item.get("text") or "").strip() or None
            return
        if kind == "reasoning":
            self._release()
            summary = item.get("summary") or []
            self.narrator.text("\n\n".join(str(s) for s in summary if str(s).strip()))
            return
        if kind == "userMessage":
            return
        self._release()
        shown = self._action(item)
        if shown is None:
            self._items.pop(item_id, None)
            return
        if self._items.pop(item_id, None) is None or item_id not in self.narrator.running:
            self.narrator.action_started(item_id, *shown)  # (codex skipped its start)
        result, failed = self._result(item)
        self.narrator.action_finished(item_id, result, failed)

    def _release(self) -> None:
        """The agent's message was not its last: a thought (merged with its neighbours)."""
        if self._said:
            self.narrator.text(self._said)
        self._said = None

    def _action(self, item: dict[str, Any]) -> tuple[str, str] | None:
        """The action Linear shows for an item, and its short parameter (None: not an action)."""
        kind = item.get("type")
        if kind == "commandExecution":
            return "Run", command_text(str(item.get("command") or ""))
        if kind == "fileChange":
            changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
            verbs = {CHANGE.get(str((c.get("kind") or {}).get("type")), "Edit") for c in changes}
            paths = ", ".join(self._path(str(c.get("path") or "")) for c in changes)
            return (verbs.pop() if len(verbs) == 1 else "Edit"), paths
        if kind == "mcpToolCall":
            return f"{item.get('server')}.{item.get('tool')}", first_text(item.get("arguments"))
        if kind == "dynamicToolCall":
            return str(item.get("tool") or "tool"), first_text(item.get("arguments"))
        if kind == "webSearch":
            return "Search", str(item.get("query") or "")
        if kind == "imageView":
            return "View image", self._path(str(item.get("path") or ""))
        return None

    def _result(self, item: dict[str, Any]) -> tuple[str, bool]:
        """An item's result as Linear shows it under its action, and whether it failed."""
        item_id = str(item.get("id") or "")
        status = str(item.get("status") or "")
        if status == "declined":
            return self.declined.pop(item_id, "Declined."), True
        if status == "inProgress":
            return UNFINISHED, False
        kind = item.get("type")
        if kind == "commandExecution":
            output = str(item.get("aggregatedOutput") or "")
            code = item.get("exitCode")
            if status == "failed" or (isinstance(code, int) and code != 0):
                return f"exit code {code}\n{output}".strip(), True
            return output, False
        if kind == "fileChange":
            changes = [c for c in item.get("changes") or [] if isinstance(c, dict)]
            sizes = "\n".join(
                f"{self._path(str(c.get('path') or ''))} {diff_size(str(c.get('diff') or ''))}"
                for c in changes
            )
            return sizes, status == "failed"
        if kind == "mcpToolCall":
            error = item.get("error")
            if isinstance(error, dict) and error.get("message"):
                return str(error["message"]), True
            result = item.get("result")
            blocks = (result.get("content") if isinstance(result, dict) else None) or []
            text = "\n".join(str(b.get("text") or "") for b in blocks if isinstance(b, dict))
            return text, status == "failed"
        return "", status == "failed"

    def _path(self, path: str) -> str:
        if self.workdir is not None and path.startswith(str(self.workdir) + os.sep):
            return os.path.relpath(path, self.workdir)
        return path

    # --- turns and requests --------------------------------------------------------------------
    def _turn_ended(self, turn: dict[str, Any]) -> TurnEnded:
        self.retrying_since = None
        status = str(turn.get("status") or "")
        for item_id in list(self._items):  # (still running: in the background, or cut short)
            self._items.pop(item_id)
            self.narrator.action_finished(item_id, UNFINISHED if status == "completed" else f"({status})")
        if status != "completed":
            self._release()  # (said before it failed or stopped: not an answer)
        failed = turn.get("error")
        error: dict[str, Any] = failed if isinstance(failed, dict) else {}
        return TurnEnded(
            turn_id=str(turn.get("id") or ""),
            status=status,
            error=str(error.get("message") or ""),
            http_status=http_status(error),
        )

    def _request(self, request_id: int | str, method: str, params: dict[str, Any]) -> Effect:
        item_id = str(params.get("itemId") or "")
        reason = str(params.get("reason") or "")
        if method == APPROVALS[0]:
            self.narrator.hold(item_id)
            return Approval(
                request_id, method, item_id, command_text(str(params.get("command") or "")), reason
            )
        if method == APPROVALS[1]:
            self.narrator.hold(item_id)
            paths = self.narrator.running[item_id].parameter if item_id in self.narrator.running else ""
            return Approval(request_id, method, item_id, paths, reason)
        if method == QUESTION:
            questions = [q for q in params.get("questions") or [] if isinstance(q, dict)]
            return Approval(request_id, method, item_id, "", reason, questions)
        return Unsupported(request_id, method)


def first_text(arguments: Any) -> str:
    """A tool call's short parameter: its first text argument."""
    if isinstance(arguments, dict):
        for value in arguments.values():
            if isinstance(value, str) and value.strip():
                return value
    return str(arguments) if isinstance(arguments, str) else ""
