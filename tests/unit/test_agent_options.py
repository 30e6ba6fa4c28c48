"""`devpilot-orchestrator --agent NAME [--agent-arg ARG]... [--approval-timeout S]`: the COMMAND it
is short for, and what it refuses before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator import cli, options
from orchestrator.runners import main as agent_main


def test_agent_is_short_for_devpilot_agent_with_the_persons_flags() -> None:
    command = options.agent_command("claude", ["--model=sonnet", "--permission-mode=acceptEdits"], 60)
    script = Path(sys.executable).parent / "devpilot-agent"
    runner = [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator.runners"]
    assert command == [
        *runner,
        "--approval-timeout",
        "60",
        "claude",
        "--model=sonnet",
        "--permission-mode=acceptEdits",
    ]
    assert options.agent_command("claude", [], None) == [*runner, "claude"]  # (its own default timeout)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--agent", "claude", "--", "my-agent"], "give --agent NAME or -- COMMAND, not both"),
        (["--agent-arg=--model=x", "--", "my-agent"], "--agent-arg and --approval-timeout go with --agent"),
        (["--agent", "claude", "--approval-timeout", "0"], "--approval-timeout must be more than 0 seconds"),
        (["--agent", "gemini"], "invalid choice: 'gemini'"),
        ([], "give the command to run after -- (or --agent claude|codex)"),
    ],
)
def test_what_the_orchestrator_refuses_before_it_starts(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["--url", "http://127.0.0.1:9", "--token", "dpo_x", *argv])
    assert ended.value.code == 2
    assert said in capsys.readouterr().err


def test_devpilot_agent_refuses_a_timeout_of_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        agent_main.main(["--model-api-timeout", "0", "codex"])
    assert ended.value.code == 2
    assert "must be more than 0 seconds" in capsys.readouterr().err
