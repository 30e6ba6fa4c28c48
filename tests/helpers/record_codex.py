"""Records what the pinned `codex app-server` really writes, one fixture per situation, into
tests/fixtures/codex/ (the mapping's tests read them: tests/unit/test_codex_events.py). Run it again
when the pinned version changes: `.venv/bin/python -m tests.helpers.record_codex [NAME]...`.

Each situation is a script of the stand-in model's replies and what the client does meanwhile (as
devpilot-agent would: accept or decline an approval, answer a question, steer the turn with a
follow-up, interrupt it). Only codex's side of the conversation is kept: its answers, notifications
and requests, as the runner reads them."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devpilot.agent_clis import CODEX
from devpilot.scripted_responses import KEY, Call, Message, Patch, Reasoning, Reply, ScriptedResponses
from orchestrator.runners.codex import DEFAULTS, native
from orchestrator.runners.lines import JsonLines
from tests.helpers.codex import environment
from tests.helpers.git import checkout
from tests.helpers.record_claude import record_all

OUT = Path(__file__).parent.parent / "fixtures" / "codex"
WORK = "/work/cart"  # (where the recordings say they ran)
PLAN = [{"step": "Read the cart", "status": "in_progress"}, {"step": "Fix the total", "status": "pending"}]
DONE = [{"step": "Read the cart", "status": "completed"}, {"step": "Fix the total", "status": "completed"}]
FIX = "*** Begin Patch\n*** Update File: cart.py\n@@\n def total(items):\n-    return 0\n+    return sum(items)\n*** End Patch\n"


def run(command: str, **more: Any) -> Call:
    return Call("exec_command", {"cmd": command, "login": False, **more})


def escalated(command: str) -> Call:
    return run(command, sandbox_permissions="require_escalated", justification="Write outside the checkout")


class Client:
    """The app-server's client, as the runner is: requests, and codex's messages as they come."""

    def __init__(self, lines: JsonLines) -> None:
        self.lines = lines
        self.heard: list[dict[str, Any]] = []
        self.ids = iter(range(1, 1000))
        self.thread = ""

    def request(self, method: str, params: dict[str, Any]) -> int:
        request_id = next(self.ids)
        self.lines.send({"id": request_id, "method": method, "params": params})
        return request_id

    def until(
        self, done: Callable[[dict[str, Any]], bool], react: Host, timeout: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.lines.open:
            for message in self.lines.read(0.1):
                self.heard.append(message)
                react(self, message)
                if done(message):
                    return message
        raise AssertionError(f"codex did not get there in {timeout} s")


Host = Callable[[Client, dict[str, Any]], None]


def answering(decisions: list[str]) -> Host:
    """Approvals answered in turn with `decisions` (accept, decline); questions with their first option."""
    left = list(decisions)

    def host(c: Client, m: dict[str, Any]) -> None:
        method = m.get("method", "")
        if "id" in m and method.endswith("/requestApproval"):
            c.lines.send({"id": m["id"], "result": {"decision": left.pop(0)}})
        elif "id" in m and method == "item/tool/requestUserInput":
            answers = {q["id"]: {"answers": [q["options"][0]["label"]]} for q in m["params"]["questions"]}
            c.lines.send({"id": m["id"], "result": {"answers": answers}})

    return host


def once(when: Callable[[dict[str, Any]], bool], then: Callable[[Client, str], None]) -> Host:
    """`then` (with the turn's id), the first time codex says something `when` matches."""
    turn: list[str] = []
    done: list[bool] = []

    def host(c: Client, m: dict[str, Any]) -> None:
        if m.get("method") == "turn/started":
            turn.append(m["params"]["turn"]["id"])
        if not done and when(m):
            done.append(True)
            then(c, turn[-1])

    return host


def item_of(kind: str, method: str = "item/completed") -> Callable[[dict[str, Any]], bool]:
    return lambda m: m.get("method") == method and (m.get("params") or {}).get("item", {}).get("type") == kind


def steer(c: Client, turn: str) -> None:
    words = [{"type": "text", "text": "Also cover the empty cart."}]
    c.request("turn/steer", {"threadId": c.thread, "expectedTurnId": turn, "input": words})


def interrupt(c: Client, turn: str) -> None:
    time.sleep(0.5)
    c.request("turn/interrupt", {"threadId": c.thread, "turnId": turn})


def nothing(c: Client, m: dict[str, Any]) -> None:
    pass


@dataclass
class Situation:
    replies: list[Reply]
    host: Host = nothing
    args: list[str] = field(default_factory=list)  # more for `codex app-server`
    key: str = KEY  # the key the stand-in expects
    unreachable: bool = False  # the model's API at a port nothing listens on
    until_errors: int = 0  # (unreachable) record this many retry notices, then interrupt


SITUATIONS: dict[str, Situation] = {
    "tools": Situation(
        [
            Reply(
                [
                    Reasoning("Reading the cart first."),
                    Message("I'll plan, then look."),
                    Call("update_plan", {"plan": PLAN}),
                ]
            ),
            Reply([run("ls")]),
            Reply([run("cat missing.txt")]),
            Reply([Message("The total is wrong."), Patch(FIX)]),
            Reply([Call("update_plan", {"plan": DONE})]),
            Reply([Message("The cart's total now sums its items.")]),
        ]
    ),
    "approvals": Situation(
        [
            Reply([escalated("touch {outside}/allowed.txt && echo written")]),
            Reply([escalated("touch {outside}/denied.txt")]),
            Reply([Patch("*** Begin Patch\n*** Add File: {outside}/notes.md\n+notes\n*** End Patch\n")]),
            Reply([Message("One allowed, two declined.")]),
        ],
        answering(["accept", "decline", "decline"]),
    ),
    "steer": Situation(
        [
            Reply([Reasoning("Working on the cart.")], hold=30),
            Reply([Message("Covered the empty cart too.")]),
        ],
        once(item_of("reasoning"), steer),
    ),
    "interrupt": Situation(
        [Reply([Message("A long one."), run("sleep 30")])],
        once(item_of("commandExecution", "item/started"), interrupt),
    ),
    "background": Situation(
        [Reply([run("sleep 3; echo late", yield_time_ms=200)]), Reply([Message("Left it running.")])]
    ),
    "question": Situation(
        [
            Reply(
                [
                    Call(
                        "request_user_input",
                        {
                            "questions": [
                                {
                                    "header": "Database",
                                    "id": "db",
                                    "question": "Which database should the tests use?",
                                    "options": [
                                        {"label": "Postgres", "description": "The real one"},
                                        {"label": "SQLite", "description": "In memory"},
                                    ],
                                }
                            ]
                        },
                    )
                ]
            ),
            Reply([Message("Using Postgres.")]),
        ],
        answering([]),
        ["--enable", "default_mode_request_user_input"],
    ),
    "refused": Situation([Reply([Message("never")])], key="sk-another-key"),
    "dropped": Situation([Reply([Message("Half a")], drop=True)]),
    "unreachable": Situation([], unreachable=True, until_errors=2),
}


def record(name: str, codex: Path, root: Path) -> list[dict[str, Any]]:
    s = SITUATIONS[name]
    # (outside the sandbox's writable roots: the working directory, /tmp, TMPDIR)
    work, outside = (
        checkout(root / name / "work"),
        Path(tempfile.mkdtemp(prefix="codex-outside-", dir="/var/tmp")),
    )
    (work / "cart.py").write_text("def total(items):\n    return 0\n")
    replies = [
        Reply([_placed(i, outside) for i in r.items], r.hold, r.status, r.error, r.drop) for r in s.replies
    ]
    taken = iter(replies)
    model = ScriptedResponses(lambda request: next(taken, Reply([Message("(no more replies)")])), key=s.key)
    url = model.url
    if s.unreachable:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    binary, _ = native(str(codex))
    env = {"PATH": "/usr/bin:/bin", **environment(url, root / name / "home")}
    proc = subprocess.Popen(
        [binary, "app-server", *DEFAULTS, *s.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=work,
        env=env,
    )
    c = Client(JsonLines(proc))
    try:
        first = c.request("initialize", {"clientInfo": {"name": "devpilot_agent", "version": "record"}})
        c.until(lambda m: m.get("id") == first, nothing)
        c.lines.send({"method": "initialized"})
        started = c.request("thread/start", {"cwd": str(work)})
        c.thread = c.until(lambda m: m.get("id") == started, nothing)["result"]["thread"]["id"]
        c.request("turn/start", {"threadId": c.thread, "input": [{"type": "text", "text": "Fix the cart."}]})
        if s.until_errors:
            c.until(lambda m: sum(x.get("method") == "error" for x in c.heard) >= s.until_errors, s.host, 120)
            interrupt(
                c, next(m["params"]["turn"]["id"] for m in c.heard if m.get("method") == "turn/started")
            )
        c.until(lambda m: m.get("method") == "turn/completed", s.host)
    finally:
        c.lines.close_stdin()
        proc.wait(timeout=30)
        model.close()
        shutil.rmtree(outside, ignore_errors=True)
    text = json.dumps(c.heard).replace(str(work), WORK).replace(str(outside), "/outside")
    return [m for m in json.loads(text) if "delta" not in str(m.get("method", "")).lower()]


def _placed(item: Any, outside: Path) -> Any:
    """A scripted item with `{outside}` filled in (a place out of the sandbox's reach)."""
    if isinstance(item, Call):
        return Call(item.name, json.loads(json.dumps(item.arguments).replace("{outside}", str(outside))))
    if isinstance(item, Patch):
        return Patch(item.patch.replace("{outside}", str(outside)))
    return item


def main() -> int:
    return record_all(CODEX, OUT, record, sys.argv[1:] or list(SITUATIONS))


if __name__ == "__main__":
    sys.exit(main())
