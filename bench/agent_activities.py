"""How many updates a typical agent session posts to Linear through `devpilot-agent claude` and
`devpilot-agent codex`, against what posting every step of its stream would take (Linear allows a
workspace about 5,000 requests an hour, shared by every session).

Each session is the real pinned CLI (devpilot.agent_clis) on a scratch repository, its model a
scripted stand-in (devpilot.scripted_model for Claude Code, devpilot.scripted_responses for
Codex) playing the same typical fix (`STORY`): a four-step to-do list kept up to date, files
read, searched and edited, the tests run (4 s: shown running meanwhile), and a command that runs
the code allowed by the person when the CLI asks. Claude Code accepts the edits
(`--permission-mode acceptEdits`) and asks before running code; Codex edits inside its sandbox
and asks when the model wants the command run outside it. Counts, not times: the same on any
machine.

    .venv/bin/python -m bench.agent_activities [claude|codex]   (both by default)
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devpilot import demo_agent
from devpilot.scripted_model import Block, ScriptedModel, Text, ToolUse
from devpilot.scripted_responses import Call, Message, Patch, Reply, ScriptedResponses, step

ROOT = Path(__file__).parent.parent
TASKS = ["Reproduce the bug", "Fix the total", "Cover the empty cart", "Run the suite"]


# --- the story, in the agents' common words -------------------------------------------------------
@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Run:
    command: str
    asks: str = ""  # why it needs the person's leave (Codex: run outside its sandbox)


@dataclass(frozen=True)
class Read:
    path: str


@dataclass(frozen=True)
class Edit:
    path: str
    old: str  # a whole line
    new: str


@dataclass(frozen=True)
class Listed:
    """The to-do list made: `TASKS`, all pending."""


@dataclass(frozen=True)
class Todo:
    n: int  # 1-based, in TASKS
    status: str  # pending, in_progress, completed (both CLIs' words)


Move = Say | Run | Read | Edit | Listed | Todo

# One model reply a line.
STORY: list[list[Move]] = [
    [Say("Let me look at the cart first."), Run("ls"), Read("cart.py")],
    [Listed()],
    [Todo(1, "in_progress"), Run("grep -n total cart.py"), Run("git log --oneline -3")],
    [Say("The total ignores the items."), Todo(1, "completed"), Todo(2, "in_progress")],
    [Read("test_cart.py"), Run("grep -rn cart .")],
    [Edit("cart.py", "    return 0", "    return sum(items)")],
    [Todo(2, "completed"), Todo(3, "in_progress"), Say("Now the empty cart.")],
    [Edit("cart.py", "def total(items):", "def total(items=()):")],
    [Todo(3, "completed"), Todo(4, "in_progress"), Run("sleep 4 && echo '3 passed'")],
    [Run("python3 -c 'import cart; print(cart.total([1, 2]))'", asks="Run the fixed code")],
    [Todo(4, "completed")],
    [Say("Fixed: the total sums the items and an empty cart totals 0; the suite passes.")],
]


@dataclass(frozen=True)
class Steps:
    """A session's stream as a peer posting every step would post it: each text a thought, each
    action and its result another, each change of the to-do list the plan again."""

    texts: int
    actions: int
    plan_changes: int
    calls: int  # the model's tool calls
    requests: int  # the model's replies

    def naive(self) -> int:
        return self.texts + 2 * self.actions + self.plan_changes


# --- Claude Code ------------------------------------------------------------------------------
def claude_blocks(move: Move, work: Path) -> list[Block]:
    if isinstance(move, Say):
        return [Text(move.text)]
    if isinstance(move, Run):  # (the CLI itself asks before it runs code)
        return [ToolUse("Bash", {"command": move.command, "description": move.command})]
    if isinstance(move, Read):
        return [ToolUse("Read", {"file_path": str(work / move.path)})]
    if isinstance(move, Edit):
        edit = {"file_path": str(work / move.path), "old_string": move.old, "new_string": move.new}
        return [ToolUse("Edit", edit)]
    if isinstance(move, Listed):
        return [ToolUse("TaskCreate", {"subject": t, "description": t}) for t in TASKS]
    return [ToolUse("TaskUpdate", {"taskId": str(move.n), "status": move.status})]


def claude_session(work: Path) -> list[list[Block]]:
    """The story's replies; before the list is made, the CLI looks its task tools up (`ToolSearch`)."""
    lookup: list[Block] = [ToolUse("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})]
    replies = []
    for turn in STORY:
        if any(isinstance(m, Listed) for m in turn):
            replies.append(lookup)
        replies.append([b for m in turn for b in claude_blocks(m, work)])
    return replies


def claude_steps(replies: list[list[Block]]) -> Steps:
    blocks = [b for r in replies for b in r]
    return Steps(
        texts=sum(isinstance(b, Text) for b in blocks),
        actions=sum(isinstance(b, ToolUse) for b in blocks),  # (the task tools too: in its stream)
        plan_changes=sum(isinstance(b, ToolUse) and b.name.startswith("Task") for b in blocks),
        calls=sum(isinstance(b, ToolUse) for b in blocks),
        requests=len(replies),
    )


def claude_model(replies: list[list[Block]]) -> ScriptedModel:
    def script(request: dict[str, Any]) -> list[Block]:
        done = sum(1 for m in request.get("messages") or [] if m.get("role") == "assistant")
        return replies[min(done, len(replies) - 1)]

    return ScriptedModel(script)


# --- Codex --------------------------------------------------------------------------------------
def codex_item(move: Say | Run | Read | Edit) -> Message | Call | Patch:
    if isinstance(move, Say):
        return Message(move.text)
    if isinstance(move, Read):
        return Call("exec_command", {"cmd": f"cat {move.path}", "login": False})
    if isinstance(move, Edit):
        change = [f"*** Update File: {move.path}", "@@", f"-{move.old}", f"+{move.new}"]
        return Patch("\n".join(["*** Begin Patch", *change, "*** End Patch\n"]))
    escalated = {"sandbox_permissions": "require_escalated", "justification": move.asks} if move.asks else {}
    return Call("exec_command", {"cmd": move.command, "login": False, **escalated})


def codex_session() -> list[Reply]:
    """The story's replies; a reply's to-do changes are one `update_plan` (codex's tool takes the
    whole list), where the first of them stands."""
    status = dict.fromkeys(TASKS, "")
    replies = []
    for turn in STORY:
        for move in turn:
            if isinstance(move, Listed):
                status = dict.fromkeys(TASKS, "pending")
            elif isinstance(move, Todo):
                status[TASKS[move.n - 1]] = move.status
        plan = Call("update_plan", {"plan": [{"step": t, "status": s} for t, s in status.items()]})
        items: list[Message | Call | Patch] = []
        for move in turn:
            if not isinstance(move, Listed | Todo):
                items.append(codex_item(move))
            elif plan not in items:
                items.append(plan)
        replies.append(Reply(list(items)))
    return replies


def codex_calls(reply: Reply) -> int:
    return sum(isinstance(i, Call | Patch) for i in reply.items)


def codex_steps(replies: list[Reply]) -> Steps:
    items = [i for r in replies for i in r.items]
    calls = sum(codex_calls(r) for r in replies)
    plans = sum(isinstance(i, Call) and i.name == "update_plan" for i in items)
    return Steps(
        texts=sum(isinstance(i, Message) for i in items),
        actions=calls - plans,  # (`update_plan` is no item in its stream: the plan updated)
        plan_changes=plans,
        calls=calls,
        requests=len(replies),
    )


def codex_model(replies: list[Reply]) -> ScriptedResponses:
    # Where each reply starts, counted in tool results: every reply but the last calls a tool.
    starts = list(itertools.accumulate(map(codex_calls, replies[:-1]), initial=0))

    def script(request: dict[str, Any]) -> Reply:
        return replies[bisect.bisect_right(starts, step(request)) - 1]

    return ScriptedResponses(script)


# --- a session, measured ------------------------------------------------------------------------
@dataclass(frozen=True)
class Agent:
    demo: demo_agent.Agent  # its pinned CLI, and the variables that keep it offline (the demo's)
    args: list[str]  # after `devpilot-agent`
    # the work folder -> the model's stand-in and what its script plays
    play: Callable[[Path], tuple[ScriptedModel | ScriptedResponses, Steps]]


def _claude(work: Path) -> tuple[ScriptedModel, Steps]:
    replies = claude_session(work)
    return claude_model(replies), claude_steps(replies)


def _codex(work: Path) -> tuple[ScriptedResponses, Steps]:
    replies = codex_session()
    return codex_model(replies), codex_steps(replies)


AGENTS = {
    "claude": Agent(demo_agent.AGENTS["claude"], ["claude", "--permission-mode=acceptEdits"], _claude),
    "codex": Agent(demo_agent.AGENTS["codex"], ["codex"], _codex),
}


def measure(agent: Agent) -> None:
    cli = agent.demo.cli.install()
    root = Path(tempfile.mkdtemp(prefix="agent-activities-"))
    work, inbox = root / "work", root / "conversation" / "inbox"
    work.mkdir()
    inbox.mkdir(parents=True)
    (work / "cart.py").write_text("def total(items):\n    return 0\n")
    (work / "test_cart.py").write_text("from cart import total\n")
    subprocess.run([shutil.which("git") or "git", "init", "-q", str(work)], check=True)
    model, steps = agent.play(work)
    env = {
        "PATH": os.pathsep.join([str(cli.parent), os.environ.get("PATH", os.defpath)]),
        **agent.demo.env(model, root),
        "DEVPILOT_INBOX": str(inbox),
        "DEVPILOT_WORKDIR": str(work),
        "PYTHONPATH": str(ROOT),
    }
    message = {"messageId": "m", "kind": "start", "prompt": {"context": "The cart total is always 0"}}

    asked = [0]

    def approve() -> None:  # the person's Allow to each ask (each elicitation on the runner's stderr)
        while runner.poll() is None:
            n = err.read_text().count("'type': 'elicitation'")
            if n > asked[0]:
                asked[0] = n
                answer = {"kind": "prompt", "prompt": {"body": "Allow"}}
                (inbox / f"{n:03d}-allow.json").write_text(json.dumps(answer))
            time.sleep(0.1)

    err = root / "runner.stderr"
    with err.open("w") as stderr:
        runner = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.runners", *agent.args],
            stdin=subprocess.PIPE,
            stderr=stderr,
            cwd=work,
            env=env,
        )
        threading.Thread(target=approve, daemon=True).start()
        assert runner.stdin is not None
        runner.stdin.write(json.dumps(message).encode())
        runner.stdin.close()
        code = runner.wait(timeout=300)
    model.close()
    summary = re.search(r"posted (\d+) update\(s\) to Linear \((.*)\)", err.read_text())
    assert code == 0 and summary, err.read_text()[-2000:]
    assert len(model.agent_requests) == steps.requests, "the CLI did not play the whole script"
    print(
        f"{agent.demo.title} {agent.demo.cli.version}: a session of {steps.calls} tool calls ({len(TASKS)} to-dos, "
        f"{asked[0]} approval(s)), {len(model.agent_requests)} model requests:"
    )
    print(f"  devpilot-agent posted {summary.group(1)} updates: {summary.group(2)}")
    print(f"  posting every step would take {steps.naive()}")
    shutil.rmtree(root, ignore_errors=True)  # (kept when it failed: its runner.stderr says why)


def main(names: list[str]) -> int:
    for name in names or list(AGENTS):
        if name not in AGENTS:
            print(
                f"agent_activities: no agent named {name} (there are: {', '.join(AGENTS)})", file=sys.stderr
            )
            return 2
        measure(AGENTS[name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
