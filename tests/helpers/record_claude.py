"""Records the pinned `claude` CLI's real stream-json output, one fixture per situation, into
tests/fixtures/claude/ (the mapping's tests read them: tests/unit/test_claude_stream.py). Run it
again when the pinned version changes: `.venv/bin/python -m tests.helpers.record_claude`.

Each situation is a script of the stand-in model's replies and what the host answers on stdin
(as devpilot-agent would: Allow or Deny, the person's answers, an interrupt, a follow-up)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devpilot.agent_clis import CLAUDE, Pinned
from devpilot.scripted_model import ScriptedModel, Text, ToolUse, in_order
from tests.helpers.claude import Direct, environment

OUT = Path(__file__).parent.parent / "fixtures" / "claude"
TURN, FOLLOW_UP = "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
Host = Callable[[Direct, dict[str, Any]], None]


def allow(d: Direct, e: dict[str, Any]) -> None:
    if e.get("type") == "control_request" and e["request"]["subtype"] == "can_use_tool":
        r = e["request"]
        answer: dict[str, Any] = {"behavior": "allow", "updatedInput": r["input"]}
        if r["tool_name"] == "AskUserQuestion":
            q = r["input"]["questions"][0]
            answer["updatedInput"] = {**r["input"], "answers": {q["question"]: q["options"][1]["label"]}}
        d.send(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": e["request_id"], "response": answer},
            }
        )


def deny(d: Direct, e: dict[str, Any]) -> None:
    if e.get("type") == "control_request" and e["request"]["subtype"] == "can_use_tool":
        answer = {"behavior": "deny", "message": "Denied by the person in Linear."}
        d.send(
            {
                "type": "control_response",
                "response": {"subtype": "success", "request_id": e["request_id"], "response": answer},
            }
        )


def interrupt(d: Direct, e: dict[str, Any]) -> None:
    if e.get("type") == "assistant" and any(b.get("type") == "tool_use" for b in e["message"]["content"]):
        time.sleep(1.0)
        d.send(
            {"type": "control_request", "request_id": "devpilot-stop-1", "request": {"subtype": "interrupt"}}
        )


def follow_up(d: Direct, e: dict[str, Any]) -> None:
    if e.get("type") == "assistant" and any(b.get("type") == "tool_use" for b in e["message"]["content"]):
        time.sleep(0.5)
        d.user("Also cover the empty cart.", FOLLOW_UP)


SITUATIONS: dict[str, tuple[list[list[Any]], Host, dict[str, str], list[str]]] = {
    # name: (the model's replies, the host, extra environment, extra CLI flags)
    "tools": (
        [
            [
                Text("Let me look at the code."),
                ToolUse("Bash", {"command": "ls", "description": "List files"}),
            ],
            [ToolUse("Read", {"file_path": "{work}/cart.py"})],
            [ToolUse("Grep", {"pattern": "def total", "path": "{work}"})],
            [
                Text("Found it."),
                Text("Fixing the total."),
                ToolUse(
                    "Edit",
                    {
                        "file_path": "{work}/cart.py",
                        "old_string": "return 0",
                        "new_string": "return sum(items)",
                    },
                ),
            ],
            [Text("The cart total now sums its items.")],
        ],
        allow,
        {},
        [],
    ),
    "plan": (
        [
            [ToolUse("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})],
            [
                Text("Planning."),
                ToolUse(
                    "TaskCreate", {"subject": "Read the cart", "description": "read", "activeForm": "Reading"}
                ),
                ToolUse(
                    "TaskCreate", {"subject": "Fix the total", "description": "fix", "activeForm": "Fixing"}
                ),
                ToolUse("TaskCreate", {"subject": "Drop the cache", "description": "drop"}),
            ],
            [
                ToolUse("TaskUpdate", {"taskId": "1", "status": "in_progress"}),
                ToolUse("Bash", {"command": "ls"}),
            ],
            [
                ToolUse("TaskUpdate", {"taskId": "1", "status": "completed"}),
                ToolUse("TaskUpdate", {"taskId": "3", "status": "deleted"}),
            ],
            [
                ToolUse(
                    "TaskUpdate", {"taskId": "2", "status": "in_progress", "subject": "Fix the cart total"}
                )
            ],
            [Text("Planned and started.")],
        ],
        allow,
        {"CLAUDE_CODE_ENABLE_TODO_TOOLS": "1"},
        [],
    ),
    "todowrite": (
        [
            [ToolUse("ToolSearch", {"query": "select:TodoWrite"})],
            [
                ToolUse(
                    "TodoWrite",
                    {
                        "todos": [
                            {"content": "Read the cart", "status": "completed", "activeForm": "Reading"},
                            {"content": "Fix the total", "status": "in_progress", "activeForm": "Fixing"},
                        ]
                    },
                )
            ],
            [Text("Listed.")],
        ],
        allow,
        {"CLAUDE_CODE_ENABLE_TODO_TOOLS": "1", "CLAUDE_CODE_ENABLE_TASKS": "false"},
        [],
    ),
    "permission-denied": (
        [
            [
                Text("Creating the file."),
                ToolUse("Bash", {"command": "touch notes.txt", "description": "Create notes"}),
            ],
            [Text("I could not create it: it was denied.")],
        ],
        deny,
        {},
        [],
    ),
    "question": (
        [
            [
                ToolUse(
                    "AskUserQuestion",
                    {
                        "questions": [
                            {
                                "question": "Which database should the cart use?",
                                "header": "Database",
                                "options": [
                                    {"label": "Postgres", "description": "the usual"},
                                    {"label": "SQLite", "description": "one file"},
                                ],
                                "multiSelect": False,
                            }
                        ]
                    },
                )
            ],
            [Text("Going with SQLite.")],
        ],
        allow,
        {},
        [],
    ),
    "interrupt": (
        [
            [Text("Waiting."), ToolUse("Bash", {"command": "sleep 20", "description": "Wait"})],
            [Text("Woke.")],
        ],
        interrupt,
        {},
        ["--allowedTools", "Bash(sleep:*)"],
    ),
    "follow-up": (
        [
            [Text("Waiting."), ToolUse("Bash", {"command": "sleep 2", "description": "Wait"})],
            [Text("Covered the empty cart too.")],
        ],
        follow_up,
        {},
        ["--allowedTools", "Bash(sleep:*)"],
    ),
    "not-logged-in": ([[Text("never asked")]], allow, {"ANTHROPIC_API_KEY": ""}, []),
    "resume-missing": (
        [[Text("never asked")]],
        allow,
        {},
        ["--resume", "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"],
    ),
}


def _placed(value: Any, work: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{work}", str(work))
    if isinstance(value, dict):
        return {k: _placed(v, work) for k, v in value.items()}
    if isinstance(value, list):
        return [_placed(v, work) for v in value]
    return value


def record(name: str, cli: Path, root: Path) -> list[dict[str, Any]]:
    replies, host, extra, flags = SITUATIONS[name]
    work = root / name / "work"
    work.mkdir(parents=True)
    (work / "cart.py").write_text("def total(items):\n    return 0\n")
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    script = [
        [ToolUse(b.name, _placed(b.input, work)) if isinstance(b, ToolUse) else b for b in r] for r in replies
    ]
    model = ScriptedModel(in_order(script))
    try:
        env = {**environment(model, root / name / "home"), **extra}
        env = {k: v for k, v in env.items() if v}
        d = Direct(cli, env, work, *flags)
        d.user("Fix the cart total.", TURN)
        while (event := d.next()) is not None:
            host(d, event)
            if event.get("type") == "result":
                break
        d.close()
    finally:
        model.close()
    # Paths of this machine's run, as the mapping sees them relative to its working directory.
    return [json.loads(json.dumps(e).replace(str(work), "/work/cart")) for e in d.events]


def record_all(
    cli: Pinned, out: Path, record_one: Callable[[str, Path, Path], list[dict[str, Any]]], names: list[str]
) -> int:
    """Each situation `names` (all by default) recorded into `out`/NAME.jsonl, one JSON line a
    message, with the pinned CLI (installed if it is not yet)."""
    binary = cli.install()
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=f"{cli.name}-record-"))
    try:
        for name in names:
            heard = record_one(name, binary, root)
            (out / f"{name}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in heard))
            print(f"{name}: {len(heard)} lines")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main() -> int:
    return record_all(CLAUDE, OUT, record, sys.argv[1:] or list(SITUATIONS))


if __name__ == "__main__":
    sys.exit(main())
