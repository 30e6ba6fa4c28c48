"""`devpilot demo` runs the whole loop on an embedded database and cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devpilot.agent_clis import PINNED
from tests.helpers.agent_runs import pinned_cli

ROOT = Path(__file__).parent.parent


def demo(tmp_path: Path, *args: str, timeout: float = 90, **env: str) -> subprocess.CompletedProcess[str]:
    """`devpilot demo ARGS` as a person runs it, never on the tests' database."""
    kept = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TEST_DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "devpilot", "demo", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**kept, "PYTHONPATH": str(ROOT), **env},
    )


def test_demo_shows_the_timeline(tmp_path: Path) -> None:
    r = demo(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # the workspace installs the app; the engineer connects the machine with a code (headless)
    assert "demo: installed the agent in Linear's Demo Workspace" in out
    login = out.split("--name demo-laptop --no-browser\n")[1].splitlines()
    assert login[0].startswith("  Open this page on any device: http://127.0.0.1:") and login[0].endswith(
        "/enroll"
    )
    assert login[1].startswith("  and enter the code: ") and len(login[1].split()[-1]) == 9
    assert "  Registered demo-laptop for Dana Demo in Demo Workspace" in out
    assert "URL and token from the login" in out and "--token" not in out
    assert out.index("Registered demo-laptop") < out.index("webhook 'issue assigned'")
    assert "webhook 'issue assigned' -> 200 dispatched" in out
    assert "webhook 'agent session' -> 200 dispatched" in out
    timeline = [line for line in out.splitlines() if "agent started after" in line]
    assert len(timeline) == 2
    assert "working on DEMO-1 (start): Fix the login redirect" in out
    assert "working on DEMO-2 (start): @agent write the release notes" in out
    assert "started DEMO-1" in r.stderr and "acked DEMO-2" in r.stderr
    # the conversation, as Linear would show it: the agent's own words, the follow-up, the stop
    assert "webhook 'follow-up' -> 200 dispatched prompt" in out and "webhook 'stop' -> 200 stopped" in out
    shown = out.split("what Linear shows in the agent session on DEMO-2:")[1].splitlines()
    assert "  [thought] Queued for demo-laptop" in shown
    assert "  [response] Done: @agent write the release notes" in shown
    assert shown.index("  [response] Stopped, as asked in Linear.") > shown.index(
        "  [thought] Noted while working: Also mention the new login page"
    )
    # the follow-up reached the agent already working on the long task: the same process heard it
    [long_task] = [x for x in out.splitlines() if "working on DEMO-2 (prompt): Now do the long" in x]
    pid = long_task.split("[agent ")[1].split("]")[0]
    assert f"[agent {pid}] heard while working: Also mention the new login page" in out
    assert "working on DEMO-2 (prompt): Also mention" not in out  # no second agent for it
    assert "Done: Now do the long database migration" not in out  # stopped before it finished
    home = out.split("embedded Postgres in ")[1].split()[0]
    assert not Path(home).exists()


@pytest.mark.parametrize(
    ("agent", "title", "tool", "asks"),
    [
        ("claude", "Claude Code", "Bash", "Claude Code asks to use **Bash**"),
        ("codex", "Codex", "Run", "Codex asks to run `printf 'Fixed: the login redirect keeps ?next=."),
    ],
)
def test_demo_with_an_agent_shows_the_real_cli_at_work_as_linear_does(
    tmp_path: Path, agent: str, title: str, tool: str, asks: str
) -> None:
    """`devpilot demo --agent NAME`: the pinned CLI (installed for the tests) answers an issue
    through the scripted model: its command and result, the plan, the person's approval."""
    pinned_cli(PINNED[agent])
    r = demo(tmp_path, "--agent", agent, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "Registered demo-laptop for Dana Demo in Demo Workspace" in out
    assert "devpilot-orchestrator --transport listen" in out and f"--agent {agent}" in out
    shown = out.split("what Linear shows in the agent session on DEMO-3:\n")[1].split("\n\n")[0].splitlines()
    look = f"  [action] {tool} `git log --oneline -1 && ls`"
    assert look in shown
    assert shown[shown.index(look) + 2 :][:2] == [
        "      README.md",
        "      login.py",
    ]  # the real command's output, in the scratch repository
    [ask] = [line for line in shown if line.startswith("  [elicitation]")]
    assert asks in ask and ask.endswith("[Allow | Deny]")
    assert shown.index(ask) < shown.index(
        next(x for x in shown if x.startswith("  [thought] Allowed in Linear"))
    )
    assert shown[-2] == "  [response] Done: the login redirect keeps `?next=`, and CHANGELOG.md says so."
    assert shown[-1].startswith("  the session's plan: Read the login handler (completed)")
    assert f"CHANGELOG.md, written by a command {title} ran: Fixed: the login redirect keeps ?next=." in out


@pytest.mark.parametrize(
    ("agent", "package"),
    [("claude", "@anthropic-ai/claude-code@2.1.332"), ("codex", "@openai/codex@0.171.0")],
)
def test_demo_with_an_agent_says_how_to_install_it_when_it_is_not(
    tmp_path: Path, agent: str, package: str
) -> None:
    r = demo(tmp_path, "--agent", agent, timeout=60, XDG_CACHE_HOME=str(tmp_path / "empty-cache"))
    assert r.returncode == 1
    assert package in r.stdout and "not installed" in r.stdout
    assert f"python -m devpilot.agent_clis {agent}" in r.stdout
    assert "starting devpilot serve" not in r.stdout  # (nothing started)
