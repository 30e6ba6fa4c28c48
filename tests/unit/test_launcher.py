"""The launcher runs COMMAND as its child and ends as COMMAND ended (its parent's poll() reads
COMMAND's own status), after recording it in `exited/<messageId>` for an orchestrator started later."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from orchestrator.commands import Launch, exit_code, launch


@pytest.mark.parametrize(
    ("code", "expected"),
    [("raise SystemExit(3)", 3), ("pass", 0), ("import os; os.kill(os.getpid(), 15)", -signal.SIGTERM)],
)
def test_the_launcher_records_and_ends_as_command_ended(tmp_path: Path, code: str, expected: int) -> None:
    message = tmp_path / "message.json"
    message.write_text("{}")
    spec = Launch(
        marker=tmp_path / "started",
        message=message,
        errors=tmp_path / "stderr",
        taken_from_inbox=True,
        exited=tmp_path / "exited",
    )
    proc = launch(spec, [sys.executable, "-c", code], dict(os.environ), tmp_path)
    assert proc.wait(timeout=30) == expected
    assert exit_code(spec.exited) == expected
    assert int(spec.marker.read_text()) == proc.pid and not message.exists()
    assert spec.exited.stat().st_mode & 0o777 == 0o600
