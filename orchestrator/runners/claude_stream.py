"""Claude Code's stream-json output, mapped to what Linear shows (as recorded from the pinned
version, 2.1.332; its fixtures are tests/fixtures/claude/).

- `system`/`init` names the CLI's session (its id is what `--resume` takes);
- `assistant` messages hold one content block each: `text` (the agent's words: a `thought`, the
  last one the `response`) or `tool_use` (an `action`: the tool's name and its short parameter);
- `user` messages hold the `tool_result` of each call (the action's result, its first lines);
- the to-do list is kept with `TaskCreate` / `TaskUpdate` (their structured results in
  `tool_use_result`), or `TodoWrite` (its whole list as input) where the CLI enables it: it
  becomes the session's plan;
- `control_request` `can_use_tool` (with `--permission-prompt-tool stdio`) asks the host whether a
  tool may run; for `AskUserQuestion` (`requires_user_interaction`) it asks the person's answers;
- `command_lifecycle` says when each user turn written to stdin is taken and `completed`;
- `system`/`api_retry` reports the model's API failing (a 401 is final for a key);
- `result` ends a turn: `is_error`, `errors`, `result` (the last text), `subtype`.
Events of a subagent (`parent_tool_use_id` set) are its own business: the `Agent` call that
started it shows as one action with its result.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.runners.narrator import Narrator

# Tools that are the agent's plumbing or are shown otherwise (the plan, a question to the person).
NOT_ACTIONS = frozenset(
    {"ToolSearch", "TaskCreate", "TaskUpdate", "TaskList", "TaskGet", "TodoWrite", "AskUserQuestion"}
)
PLAN_STATUS = {"pending": "pending", "in_progress": "inProgress", "completed": "completed"}
TURN_ENDED = frozenset({"completed", "cancelled", "dropped", "failed"})


@dataclass(frozen=True)
class Init:
    session_id: str


@dataclass(frozen=True)
class Permission:
    """The CLI asks whether a tool may run (or, for AskUserQuestion, the person's answers)."""

    request_id: str
    tool: str
    input: dict[str, Any]
    tool_use_id: str
    description: str = ""

    @property
    def questions(self) -> list[dict[str, Any]]:
        asked = self.input.get("questions") if self.tool == "AskUserQuestion" else None
        return [q for q in asked if isinstance(q, dict)] if isinstance(asked, list) else []


@dataclass(frozen=True)
class Unsupported:
    """A control request this host does not serve (hooks, SDK MCP servers): answered with an error."""

    request_id: str
    subtype: str


@dataclass(frozen=True)
class Cancelled:
    """The CLI withdrew a control request (the person's answer is no longer awaited)."""

    request_id: str


@dataclass(frozen=True)
class TurnEnded:
    uuid: str


@dataclass(frozen=True)
class Retry:
    status: int | None
    error: str
    attempt: int
    of: int


@dataclass(frozen=True)
class Result:
    text: str
    is_error: bool
    reason: str
    subtype: str
    api_status: int | None


Effect = Init | Permission | Unsupported | Cancelled | TurnEnded | Retry | Result


def parameter(tool: str, given: dict[str, Any], workdir: Path | None = None) -> str:
    """A tool call's short argument, as Linear shows it beside the action: the command, the file
    (relative to the working directory), the pattern, the address."""

    def path(key: str) -> str:
        value = str(given.get(key) or "")
        if workdir is not None and value.startswith(str(workdir) + os.sep):
            return os.path.relpath(value, workdir)
        return value

    if tool == "Bash":
        return str(given.get("command") or "")
    if tool in ("Read", "Write", "Edit", "MultiEdit"):
        return path("file_path")
    if tool == "NotebookEdit":
        return path("notebook_path")
    if tool in ("Grep", "Glob"):
        where = path("path")
        return str(given.get("pattern") or "") + (f" in {where}" if where else "")
    if tool == "WebFetch":
        return str(given.get("url") or "")
    if tool == "WebSearch":
        return str(given.get("query") or "")
    if tool in ("Agent", "Task"):
        return str(given.get("description") or given.get("prompt") or "")
    for value in given.values():  # any other tool (an MCP server's): its first text argument
        if isinstance(value, str) and value.strip():
            return value
    return ""


def result_text(content: Any) -> str:
    """A tool_result's content as text (a string, or blocks of which the text ones count), without
    the CLI's `<tool_use_error>` markup."""
    if isinstance(content, list):
        content = "\n".join(
            str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return re.sub(r"</?tool_use_error>", "", content) if isinstance(content, str) else ""


def failure(result: dict[str, Any]) -> str:
    """Why a turn failed, as the CLI says it: its errors, else its text, else its subtype."""
    errors = result.get("errors")
    if isinstance(errors, list) and errors:
        return "; ".join(str(e) for e in errors)
    return str(result.get("result") or result.get("subtype") or "unknown failure")


@dataclass
class ClaudeStream:
    narrator: Narrator
    workdir: Path | None = None
    tasks: dict[str, dict[str, str]] = field(default_factory=dict)  # the to-do list, by task id
    session_id: str | None = None
    _creating: dict[str, str] = field(default_factory=dict)  # TaskCreate calls awaiting their id
    _calls: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # tool_use id -> call

    def feed(self, event: dict[str, Any]) -> list[Effect]:
        kind = event.get("type")
        if event.get("parent_tool_use_id"):
            return []
        if kind == "system":
            return self._system(event)
        if kind == "assistant":
            self._assistant(event)
        elif kind == "user":
            self._user(event)
        elif kind == "control_request":
            return self._control(event)
        elif kind == "control_cancel_request" and event.get("request_id"):
            return [Cancelled(str(event["request_id"]))]
        elif kind == "command_lifecycle" and event.get("state") in TURN_ENDED and event.get("command_uuid"):
            return [TurnEnded(str(event["command_uuid"]))]
        elif kind == "result":
            self.session_id = str(event.get("session_id") or self.session_id or "") or None
            is_error = bool(event.get("is_error")) or event.get("subtype") not in (None, "success")
            status = event.get("api_error_status")
            return [
                Result(
                    text=str(event.get("result") or ""),
                    is_error=is_error,
                    reason=failure(event) if is_error else "",
                    subtype=str(event.get("subtype") or ""),
                    api_status=status if isinstance(status, int) else None,
                )
            ]
        return []

    def plan(self) -> list[dict[str, str]]:
        return [
            {"content": t["subject"], "status": PLAN_STATUS.get(t["status"], "pending")}
            for t in self.tasks.values()
        ]

    # --- events --------------------------------------------------------------------------------
    def _system(self, event: dict[str, Any]) -> list[Effect]:
        if event.get("subtype") == "init" and event.get("session_id"):
            self.session_id = str(event["session_id"])
            return [Init(self.session_id)]
        if event.get("subtype") == "api_retry":
            status = event.get("error_status")
            return [
                Retry(
                    status=status if isinstance(status, int) else None,
                    error=str(event.get("error") or ""),
                    attempt=int(event.get("attempt") or 0),
                    of=int(event.get("max_retries") or 0),
                )
            ]
        return []

    def _assistant(self, event: dict[str, Any]) -> None:
        if event.get("error"):  # a message the CLI made up to say it failed: the result says it
            return
        for block in (event.get("message") or {}).get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                self.narrator.text(str(block.get("text") or ""))
            elif block.get("type") == "tool_use":
                self._tool_use(str(block.get("id") or ""), str(block.get("name") or ""), block.get("input"))

    def _tool_use(self, use_id: str, tool: str, given: Any) -> None:
        given = given if isinstance(given, dict) else {}
        self._calls[use_id] = (tool, given)
        if tool == "TaskCreate" and given.get("subject"):
            self._creating[use_id] = str(given["subject"])  # (its id comes with its result)
        elif tool == "TaskUpdate":
            self._task_updated(given)  # (now: the call the agent makes next may be the work it starts)
        elif tool == "TodoWrite" and isinstance(given.get("todos"), list):
            self.tasks = {
                str(i): {"subject": str(t.get("content") or ""), "status": str(t.get("status") or "pending")}
                for i, t in enumerate(given["todos"], 1)
                if isinstance(t, dict)
            }
            self.narrator.plan(self.plan())
        if tool not in NOT_ACTIONS:
            self.narrator.action_started(use_id, tool, parameter(tool, given, self.workdir))

    def _user(self, event: dict[str, Any]) -> None:
        content = (event.get("message") or {}).get("content")
        if not isinstance(content, list):
            return
        structured = event.get("tool_use_result")
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            use_id = str(block.get("tool_use_id") or "")
            tool, _ = self._calls.pop(use_id, ("", {}))
            is_error = bool(block.get("is_error"))
            if tool == "TaskCreate" and not is_error:
                self._task_created(use_id, structured, result_text(block.get("content")))
            if tool not in NOT_ACTIONS:
                self.narrator.action_finished(use_id, result_text(block.get("content")), is_error)

    def _task_created(self, use_id: str, structured: Any, text: str) -> None:
        subject = self._creating.pop(use_id, "")
        task = structured.get("task") if isinstance(structured, dict) else None
        task_id = str(task.get("id")) if isinstance(task, dict) and task.get("id") is not None else ""
        if not task_id and (m := re.search(r"Task #(\w+) created", text)):
            task_id = m.group(1)
        if task_id and subject:
            self.tasks[task_id] = {"subject": subject, "status": "pending"}
            self.narrator.plan(self.plan())

    def _task_updated(self, given: dict[str, Any]) -> None:
        task_id = str(given.get("taskId") or "")
        if task_id not in self.tasks:
            return
        if given.get("status") == "deleted":
            del self.tasks[task_id]
        else:
            if given.get("status") in PLAN_STATUS:
                self.tasks[task_id]["status"] = str(given["status"])
            if given.get("subject"):
                self.tasks[task_id]["subject"] = str(given["subject"])
        self.narrator.plan(self.plan())

    def _control(self, event: dict[str, Any]) -> list[Effect]:
        request = event.get("request") or {}
        request_id = str(event.get("request_id") or "")
        if request.get("subtype") == "can_use_tool":
            use_id = str(request.get("tool_use_id") or "")
            given = request.get("input")
            if not given and use_id in self._calls:  # (ExitPlanMode's comes empty: its plan is the call's)
                given = self._calls[use_id][1]
            asked = Permission(
                request_id=request_id,
                tool=str(request.get("tool_name") or ""),
                input=given if isinstance(given, dict) else {},
                tool_use_id=use_id,
                description=str(request.get("description") or ""),
            )
            self.narrator.hold(asked.tool_use_id)
            return [asked]
        return [Unsupported(request_id, str(request.get("subtype") or ""))]
