"""`devpilot demo --agent claude|codex`: after the demo's service, install and login, the real
agent CLI (the pinned version, devpilot.agent_clis) works on an issue through `devpilot-orchestrator
--agent NAME`, its model a scripted stand-in of its API (devpilot.scripted_model for Claude Code's
Messages API, devpilot.scripted_responses for Codex's Responses API): it looks at a scratch
repository with a real command, keeps a to-do list (the session's plan), asks to write a file (the
person presses Allow in Linear: a `prompted` webhook with the select signal) and answers. Prints
what Linear shows, as it shows it."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devpilot import scripted_model, scripted_responses
from devpilot.agent_clis import CLAUDE, CODEX, Pinned
from devpilot.demo_events import prompted
from devpilot.scripted_model import Block, ScriptedModel, Text, ToolUse
from devpilot.scripted_responses import Call, Message, Reasoning, Reply, ScriptedResponses, codex_config, step
from shared.linear.webhooks import sign

AGENT_SESSION = "demo-agent-session"
CHANGELOG = "printf 'Fixed: the login redirect keeps ?next=.\\n' >> CHANGELOG.md"
LOOK = "git log --oneline -1 && ls"
NOTING = "The redirect dropped the `next` parameter; noting the fix."
DONE = "Done: the login redirect keeps `?next=`, and CHANGELOG.md says so."
STEPS = ("Read the login handler", "Fix the redirect", "Note it in the changelog")
CLAUDE_REPLIES: list[list[Block]] = [
    [Text("I'll look at the repository first."), ToolUse("Bash", {"command": LOOK})],
    [ToolUse("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})],
    [ToolUse("TaskCreate", {"subject": step, "description": step.split()[0].lower()}) for step in STEPS],
    [
        ToolUse("TaskUpdate", {"taskId": "1", "status": "completed"}),
        ToolUse("TaskUpdate", {"taskId": "2", "status": "completed"}),
        ToolUse("TaskUpdate", {"taskId": "3", "status": "in_progress"}),
        Text(NOTING),
        ToolUse("Bash", {"command": CHANGELOG, "description": "Note the fix in the changelog"}),
    ],
    [ToolUse("TaskUpdate", {"taskId": "3", "status": "completed"})],
    [Text(DONE)],
]


def _plan(*statuses: str) -> Call:
    return Call(
        "update_plan", {"plan": [{"step": s, "status": t} for s, t in zip(STEPS, statuses, strict=True)]}
    )


CODEX_REPLIES = [
    Reply(
        [Reasoning("I'll look at the repository first."), Call("exec_command", {"cmd": LOOK, "login": False})]
    ),
    Reply([_plan("completed", "completed", "in_progress")]),
    Reply(
        [
            Message(NOTING),
            Call(
                "exec_command",
                {
                    "cmd": CHANGELOG,
                    "login": False,
                    "sandbox_permissions": "require_escalated",
                    "justification": "Note the fix in the changelog",
                },
            ),
        ]
    ),
    Reply([_plan("completed", "completed", "completed")]),
    Reply([Message(DONE)]),
]
QUIET = {
    "DISABLE_TELEMETRY": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}


@dataclass(frozen=True)
class Agent:
    """An agent of the demo: its pinned CLI and how it runs offline against its stand-in."""

    name: str
    title: str
    cli: Pinned
    # its model's stand-in, and the variables the CLI needs for it (HOME and the like, in `home`)
    model: Callable[[], ScriptedModel | ScriptedResponses]
    env: Callable[[Any, Path], dict[str, str]]


def _claude_env(model: ScriptedModel, home: Path) -> dict[str, str]:
    return {
        "HOME": str(home / "claude-home"),  # (the CLI's sessions and settings: not the person's)
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": scripted_model.KEY,
        **QUIET,
    }


def _codex_env(model: ScriptedResponses, home: Path) -> dict[str, str]:
    codex_home = home / "codex-home" / ".codex"  # (its config, login and threads: not the person's)
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(codex_config(model.url))
    return {
        "HOME": str(codex_home.parent),
        "CODEX_HOME": str(codex_home),
        scripted_responses.KEY_ENV: scripted_responses.KEY,
    }


def _claude_script(request: dict[str, Any]) -> list[Block]:
    done = sum(1 for m in request.get("messages") or [] if m.get("role") == "assistant")
    return CLAUDE_REPLIES[min(done, len(CLAUDE_REPLIES) - 1)]


AGENTS = {
    "claude": Agent("claude", "Claude Code", CLAUDE, lambda: ScriptedModel(_claude_script), _claude_env),
    "codex": Agent(
        "codex",
        "Codex",
        CODEX,
        lambda: ScriptedResponses(lambda r: CODEX_REPLIES[min(step(r), len(CODEX_REPLIES) - 1)]),
        _codex_env,
    ),
}


def missing(name: str) -> str | None:
    """How to install the agent's pinned CLI, when it is not installed (None: it is)."""
    agent = AGENTS[name]
    if agent.cli.installed() is not None:
        return None
    return (
        f"demo: --agent {name} runs the real {agent.title} CLI, pinned at {agent.cli.package}, which is\n"
        f"      not installed in {agent.cli.folder()}. Install it with npm (some 100 MB) with\n"
        f"        python -m devpilot.agent_clis {name}     (in a checkout: .venv/bin/python -m devpilot.agent_clis {name})\n"
        "      then run the demo again. Nothing was started."
    )


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
            "comment": {"id": "demo-agent-comment", "body": body},
            "sourceCommentId": "demo-agent-comment",
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
    name: str,
    http: httpx.Client,
    secret: str,
    activities: list[dict[str, Any]],
    plans: list[list[dict[str, str]]],
    home: Path,
    env: dict[str, str],
    wait: Callable[[Callable[[], bool], float, str], None],
) -> None:
    agent = AGENTS[name]
    cli = agent.cli.installed()
    assert cli is not None  # (checked before the demo started anything)
    model = agent.model()
    repo = _repository(home / "shop")
    variables = agent.env(model, home)
    agent_env = {**env, "PATH": os.pathsep.join([str(cli.parent), env.get("PATH", os.defpath)]), **variables}
    passed = [x for variable in variables if variable != "HOME" for x in ("--pass-env", variable)]
    command = ["devpilot-orchestrator", "--transport", "listen", *passed, "--agent", name]
    print(f"\ndemo: $ cd {repo.name} && {' '.join(command)}")
    print(f"      ({agent.cli.package} from {cli.parent}; its model: a scripted stand-in at {model.url})")
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
        wait(
            lambda: any(a["content"]["type"] == "elicitation" for a in mine()),
            60,
            f"{agent.title}'s question",
        )
        print(f"demo: {agent.title} asks before it writes a file; the person presses Allow in Linear")
        send("Allow", prompted("Allow", AGENT_SESSION, signal="select"))
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
    written = (repo / "CHANGELOG.md").read_text().strip()
    print(f"\ndemo: {repo.name}/CHANGELOG.md, written by a command {agent.title} ran: {written}")
    print(f"demo: the stand-in model answered {len(model.agent_requests)} requests of {agent.title}")


def _shown(a: dict[str, Any]) -> str:
    c = a["content"]
    if c["type"] == "action":
        result = "\n".join(f"      {line}" for line in str(c.get("result") or "").splitlines())
        return f"  [action] {c['action']} `{c['parameter']}`" + (f"\n{result}" if result else "")
    options = [o.get("label") or o.get("value") for o in (a.get("signalMetadata") or {}).get("options") or []]
    choice = f"  [{' | '.join(options)}]" if options else ""
    passing = "  (ephemeral: Linear replaces it with the next)" if a.get("ephemeral") else ""
    return f"  [{c['type']}] {c['body']}{choice}{passing}"
