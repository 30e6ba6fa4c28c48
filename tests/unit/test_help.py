"""What a newcomer reads first: `./dev --help` (before anything is installed), a mistyped `./dev`
command, `devpilot-orchestrator --help` and `login --help`, each run as the real process."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.cli import build_parser

ROOT = Path(__file__).parent.parent.parent


def fresh_clone(tmp_path: Path) -> Path:
    """What `./dev` sees in a clone nobody has run it in: the script and pyproject.toml, no .venv."""
    clone = tmp_path / "clone"
    clone.mkdir()
    for name in ("dev", "pyproject.toml"):
        shutil.copy2(ROOT / name, clone / name)
    return clone


def dev(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # PYTHON=false: an install (python -m venv) would fail loudly, so answering proves none was tried
    env = {**os.environ, "PYTHON": "false"}
    return subprocess.run([str(clone / "dev"), *args], capture_output=True, text=True, env=env, timeout=30)


def test_dev_help_answers_before_any_install_in_clean_text(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    for asked in ("--help", "-h", "help"):
        r = dev(clone, asked)
        assert r.returncode == 0, r.stderr
        assert r.stderr == "" and not (clone / ".venv").exists()
        lines = r.stdout.splitlines()
        assert lines[0] == "usage: ./dev COMMAND [ARGS...]"
        assert not any(line.lstrip().startswith("#") for line in lines)  # not the script's comments
        assert all(len(line) <= 80 for line in lines)
        said = r.stdout
        for command in ("./dev serve", "./dev devpilot demo", "./dev test", "./dev lint"):
            assert command in said, command
        assert "devpilot devpilot-orchestrator" in said  # the console scripts, read from pyproject.toml


def test_a_command_dev_does_not_have_is_named_with_the_ones_it_has(tmp_path: Path) -> None:
    clone = fresh_clone(tmp_path)
    r = dev(clone, "nonsense")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[0] == "dev: 'nonsense' is not a command."
    assert "./dev serve" in r.stderr and "./dev devpilot demo" in r.stderr
    assert not (clone / ".venv").exists()


def orchestrator_help(*args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80", **(env or {})},
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_orchestrator_help_lists_its_commands_and_every_option_with_its_default() -> None:
    secret = "dpo_this-must-never-show"  # (a default taken from the environment is never printed)
    text = orchestrator_help(env={"DEVPILOT_ORCHESTRATOR_TOKEN": secret})
    assert secret not in text
    for command in ("login", "whoami", "machines", "logout", "activity", "plan"):
        assert re.search(rf"^  {command} +\S.+$", text, re.MULTILINE), f"{command} has no line of its own"
    flat = " ".join(text.split())  # (argparse wraps the help texts)
    for action in build_parser()._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        name = action.option_strings[-1]
        assert action.help, f"{name} has no help text"
        if action.dest in ("token", "endpoints"):  # from the environment: named, never shown
            continue
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert f"(default: {action.default})" in flat, f"{name}'s default is not said"


def test_login_help_says_what_login_does() -> None:
    text = " ".join(orchestrator_help("login").split())
    assert "Register this machine for you" in text and "sign in with Linear" in text
    assert "state directory" in text and "exit 1" in text
