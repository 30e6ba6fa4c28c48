"""`devpilot demo --agent claude`: after the demo's service, install and login, the real `claude`
CLI (the pinned version, devpilot.agent_clis) works on an issue through `devpilot-orchestrator
--agent claude`, its model the scripted stand-in of the Messages API (devpilot.scripted_model):
it looks at a scratch repository with a real Bash command, keeps a to-do list (the session's
plan), asks to write a file (the person presses Allow in Linear: a `prompted` webhook with the
select signal) and answers. Prints what Linear shows, as it shows it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from devpilot.agent_clis import CLAUDE
from devpilot.demo import _prompted
from devpilot.scripted_model import KEY, Block, ScriptedModel, Text, ToolUse
from shared.linear import sign

AGENT_SESSION = "demo-claude-session"
CHANGELOG = "printf 'Fixed: the login redirect keeps ?next=.\\n' >> CHANGELOG.md"
REPLIES: list[list[Block]] = [
    [Text("I'll look at the repository first."), ToolUse("Bash", {"command": "git log --oneline -1 && ls"})],
    [ToolUse("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})],
    [
        ToolUse("TaskCreate", {"subject": "Read the login handler", "description": "read"}),
        ToolUse("TaskCreate", {"subject": "Fix the redirect", "description": "fix"}),
        ToolUse("TaskCreate", {"subject": "Note it in the changelog", "description": "note"}),
    ],
    [
        ToolUse("TaskUpdate", {"taskId": "1", "status": "completed"}),
        ToolUse("TaskUpdate", {"taskId": "2", "status": "completed"}),
        ToolUse("TaskUpdate", {"taskId": "3", "status": "in_progress"}),
        Text("The redirect dropped the `next` parameter; noting the fix."),
        ToolUse("Bash", {"command": CHANGELOG, "description": "Note the fix in the changelog"}),
    ],
    [ToolUse("TaskUpdate", {"taskId": "3", "status": "completed"})],
    [Text("Done: the login redirect keeps `?next=`, and CHANGELOG.md says so.")],
]
QUIET = {
    "DISABLE_TELEMETRY": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}


def missing() -> str | None:
    """How to install the pinned CLI, when it is not installed (None: it is)."""
    if CLAUDE.installed() is not None:
        return None
    return (
        f"demo: --agent claude runs the real Claude Code CLI, pinned at {CLAUDE.package}, which is\n"
        f"      not installed in {CLAUDE.folder()}. Install it (npm, about 100 MB) with\n"
        "        python -m devpilot.agent_clis claude     (./dev python -m devpilot.agent_clis claude here)\n"
        "      then run the demo again. Nothing was started."
    )


def _script(request: dict[str, Any]) -> list[Block]:
    done = sum(1 for m in request.get("messages") or [] if m.get("role") == "assistant")
    return REPLIES[min(done, len(REPLIES) - 1)]


def _created(body: str) -> dict[str, Any]:
    return {
        "type": "AgentSessionEvent",
        "action": "created",
        "organizationId": "demo-org",
        "webhookTimestamp": int(time.time() * 1000),
        "agentSession": {
            "id": AGENT_SESSION,
            "creatorId": "demo-user",
            "issue": {
                "id": "demo-issue-3",
                "identifier": "DEMO-3",
                "title": "The login redirect forgets where you were",
                "url": "https://linear.app/demo/issue/DEMO-3",
            },
            "comment": {"id": "demo-claude-comment", "body": body},
            "sourceCommentId": "demo-claude-comment",
        },
        "promptContext": '<issue identifier="DEMO-3"><title>The login redirect forgets where you were</title>'
        f"</issue>\n<comment>{body}</comment>",
    }


def _repository(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "README.md").write_text("# shop\n")
    (where / "login.py").write_text("def redirect(request):\n    return '/'\n")
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=demo", "-c", "user.email=demo@example.com", "commit", "-qm", "shop"],
    ):
        subprocess.run([shutil.which("git") or "git", *args], cwd=where, check=True, capture_output=True)
    return where


def run(
    http: httpx.Client,
    secret: str,
    activities: list[dict[str, Any]],
    plans: list[list[dict[str, str]]],
    home: Path,
    env: dict[str, str],
    wait: Callable[[Callable[[], bool], float, str], None],
) -> None:
    cli = CLAUDE.installed()
    assert cli is not None  # (checked before the demo started anything)
    model = ScriptedModel(_script)
    repo = _repository(home / "shop")
    agent_env = {
        **env,
        "PATH": os.pathsep.join([str(cli.parent), env.get("PATH", os.defpath)]),
        "HOME": str(home / "claude-home"),  # (the CLI's sessions and settings: not the person's)
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": KEY,
        **QUIET,
    }
    passed = [x for name in ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", *QUIET] for x in ("--pass-env", name)]
    command = ["devpilot-orchestrator", "--transport", "listen", *passed, "--agent", "claude"]
    print(f"\ndemo: $ cd {repo.name} && {' '.join(command)}")
    print(f"      ({CLAUDE.package} from {cli.parent}; its model: a scripted stand-in at {model.url})")
    orch = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *command[1:], "--state-dir", str(home / "state")],
        cwd=repo,
        env=agent_env,
        stderr=subprocess.DEVNULL,
    )

    def send(label: str, event: dict[str, Any]) -> None:
        body = json.dumps(event).encode()
        r = http.post(
            "/webhook",
            content=body,
            headers={"Linear-Signature": sign(secret, body), "Linear-Delivery": secrets.token_hex(8)},
        )
        print(f"demo: webhook '{label}' -> {r.status_code} {r.json()['status']}")

    def mine() -> list[dict[str, Any]]:
        return [a for a in activities if a.get("agentSessionId") == AGENT_SESSION]

    try:
        time.sleep(0.8)  # (its first long-poll)
        send("agent session (DEMO-3)", _created("@agent the login redirect forgets ?next="))
        wait(lambda: any(a["content"]["type"] == "elicitation" for a in mine()), 60, "Claude Code's question")
        print("demo: Claude Code asks before it writes a file; the person presses Allow in Linear")
        send("Allow", _prompted("Allow", signal="select", session=AGENT_SESSION))
        wait(lambda: any(a["content"]["type"] in ("response", "error") for a in mine()), 60, "its answer")
    finally:
        orch.terminate()
        orch.wait(timeout=30)
        model.close()
    print("\nwhat Linear shows in the agent session on DEMO-3:")
    for a in mine():
        print(_shown(a))
    if plans:
        steps = ", ".join(f"{s['content']} ({s['status']})" for s in plans[-1])
        print(f"  the session's plan: {steps}")
    print(
        f"\ndemo: {repo.name}/CHANGELOG.md, written by Claude Code's Bash tool: {(repo / 'CHANGELOG.md').read_text().strip()}"
    )
    print(f"demo: the stand-in model answered {len(model.agent_requests)} requests of Claude Code")


def _shown(a: dict[str, Any]) -> str:
    c = a["content"]
    if c["type"] == "action":
        result = "\n".join(f"      {line}" for line in str(c.get("result") or "").splitlines())
        return f"  [action] {c['action']} `{c['parameter']}`" + (f"\n{result}" if result else "")
    options = [o.get("label") or o.get("value") for o in (a.get("signalMetadata") or {}).get("options") or []]
    choice = f"  [{' | '.join(options)}]" if options else ""
    passing = "  (ephemeral: Linear replaces it with the next)" if a.get("ephemeral") else ""
    return f"  [{c['type']}] {c['body']}{choice}{passing}"
