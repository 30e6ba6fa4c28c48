"""The real `claude` CLI in tests, offline: the pinned version (installed by devpilot.agent_clis
into its cache folder on first use; without npm the tests skip and say why), a HOME of its own,
the scripted stand-in of the Messages API (devpilot.scripted_model) as its API, and its
nonessential traffic off (telemetry, error reports, update checks: the documented switches)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from devpilot.agent_clis import CLAUDE
from devpilot.scripted_model import KEY, ScriptedModel
from tests.helpers.agent_runs import pinned_cli

QUIET = {
    "DISABLE_TELEMETRY": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}
# What the orchestrator passes its agent (--pass-env): the API the CLI talks to, its key, quiet.
PASSED = ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", *QUIET]


def cli() -> Path:
    """The pinned CLI (installed, or the test skips: tests.helpers.agent_runs)."""
    return pinned_cli(CLAUDE)


def environment(model: ScriptedModel, home: Path, key: str = KEY) -> dict[str, str]:
    """The CLI's variables: its API (the stand-in), its key, quiet, and a HOME of its own (its
    sessions, settings and credentials live there, never in the person's)."""
    home.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": key, **QUIET}


class Direct:
    """The CLI run directly with the runner's flags (no runner): to record its stream as fixtures."""

    def __init__(self, cli_path: Path, env: dict[str, str], cwd: Path, *args: str) -> None:
        argv = [str(cli_path), "-p", "--input-format", "stream-json", "--output-format", "stream-json"]
        self.proc = subprocess.Popen(
            [*argv, "--verbose", "--permission-prompt-tool", "stdio", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env={"PATH": os.environ.get("PATH", os.defpath), **env},
            text=True,
        )
        self.events: list[dict[str, Any]] = []

    def send(self, line: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(line) + "\n")
        self.proc.stdin.flush()

    def user(self, text: str, turn: str) -> None:
        self.send(
            {
                "type": "user",
                "message": {"role": "user", "content": text},
                "parent_tool_use_id": None,
                "session_id": "",
                "uuid": turn,
            }
        )

    def next(self, timeout: float = 60) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline()
        assert time.monotonic() < deadline, "the CLI said nothing in time"
        if not line:
            return None
        event: dict[str, Any] = json.loads(line)
        self.events.append(event)
        return event

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        while self.next() is not None:
            pass
        return self.proc.wait(timeout=30)
