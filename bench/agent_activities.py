"""How many updates a typical Claude Code session posts to Linear through `devpilot-agent claude`,
against what posting every step of its stream would take (Linear allows a workspace about 5,000
requests an hour, shared by every session).

The session is the real pinned CLI (devpilot.agent_clis) on a scratch repository, its model the
scripted stand-in (devpilot.scripted_model) playing a typical fix: a four-step to-do list kept up
to date, files read, searched and edited, the tests run (4 s: shown running meanwhile),
the edits accepted (`--permission-mode acceptEdits`), and a command that runs the code
allowed by the person when the CLI asks. Counts, not times: the same on any machine.

    .venv/bin/python -m bench.agent_activities
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from devpilot.agent_clis import CLAUDE
from devpilot.scripted_model import KEY, Block, ScriptedModel, Text, ToolUse

ROOT = Path(__file__).parent.parent
TASKS = ["Reproduce the bug", "Fix the total", "Cover the empty cart", "Run the suite"]


def session(work: Path) -> list[list[Block]]:
    def update(n: int, status: str) -> ToolUse:
        return ToolUse("TaskUpdate", {"taskId": str(n), "status": status})

    def bash(command: str) -> ToolUse:
        return ToolUse("Bash", {"command": command, "description": command})

    cart = str(work / "cart.py")
    return [
        [Text("Let me look at the cart first."), bash("ls"), ToolUse("Read", {"file_path": cart})],
        [ToolUse("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})],
        [ToolUse("TaskCreate", {"subject": t, "description": t}) for t in TASKS],
        [update(1, "in_progress"), bash("grep -n total cart.py"), bash("git log --oneline -3")],
        [Text("The total ignores the items."), update(1, "completed"), update(2, "in_progress")],
        [ToolUse("Read", {"file_path": str(work / "test_cart.py")}), bash("grep -rn cart .")],
        [ToolUse("Edit", {"file_path": cart, "old_string": "return 0", "new_string": "return sum(items)"})],
        [update(2, "completed"), update(3, "in_progress"), Text("Now the empty cart.")],
        [
            ToolUse(
                "Edit",
                {"file_path": cart, "old_string": "def total(items):", "new_string": "def total(items=()):"},
            )
        ],
        [update(3, "completed"), update(4, "in_progress"), bash("sleep 4 && echo '3 passed'")],
        [bash("python3 -c 'import cart; print(cart.total([1, 2]))'")],  # (runs code: the person is asked)
        [update(4, "completed")],
        [Text("Fixed: the total sums the items and an empty cart totals 0; the suite passes.")],
    ]


def naive(replies: list[list[Block]]) -> int:
    """Every step of the stream posted as it comes: each text a thought, each tool call an action
    and its result another, each to-do change the plan again (a peer streaming everything)."""
    texts = sum(isinstance(b, Text) for r in replies for b in r)
    calls = sum(isinstance(b, ToolUse) for r in replies for b in r)
    plan_changes = sum(isinstance(b, ToolUse) and b.name.startswith("Task") for r in replies for b in r)
    return texts + 2 * calls + plan_changes


def main() -> int:
    cli = CLAUDE.install()
    root = Path(tempfile.mkdtemp(prefix="agent-activities-"))
    work, inbox = root / "work", root / "conversation" / "inbox"
    work.mkdir()
    inbox.mkdir(parents=True)
    (work / "cart.py").write_text("def total(items):\n    return 0\n")
    (work / "test_cart.py").write_text("from cart import total\n")
    subprocess.run([shutil.which("git") or "git", "init", "-q", str(work)], check=True)
    replies = session(work)

    def script(request: dict[str, Any]) -> list[Block]:
        done = sum(1 for m in request.get("messages") or [] if m.get("role") == "assistant")
        return replies[min(done, len(replies) - 1)]

    model = ScriptedModel(script)
    env = {
        "PATH": os.pathsep.join([str(cli.parent), os.environ.get("PATH", os.defpath)]),
        "HOME": str(root / "home"),
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": KEY,
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
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
            [sys.executable, "-m", "orchestrator.runners", "claude", "--permission-mode=acceptEdits"],
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
    calls = sum(isinstance(b, ToolUse) for r in replies for b in r)
    print(
        f"a session of {calls} tool calls ({len(TASKS)} to-dos, {asked[0]} approval(s)), "
        f"{len(model.agent_requests)} model requests:"
    )
    print(f"  devpilot-agent posted {summary.group(1)} updates: {summary.group(2)}")
    print(f"  posting every step would take {naive(replies)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
