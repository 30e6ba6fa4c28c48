"""The type half of the guarantee: mypy --strict rejects an enqueue (`enqueue_dispatch`,
`route_and_enqueue`) given a connection instead of a transaction."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).parent / "typecheck_cases"
ROOT = Path(__file__).parent.parent


def run_mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("case", ["enqueue_with_connection.py", "enqueue_with_tx.py"])
def test_mypy_on_enqueue_calls(case: str) -> None:
    result = run_mypy(CASES / case)
    if case == "enqueue_with_tx.py":
        assert result.returncode == 0, result.stdout
    else:
        assert result.returncode == 1, result.stdout
        assert 'Argument 1 to "enqueue_dispatch" has incompatible type "Connection[' in result.stdout
        assert 'expected "Tx"' in result.stdout
        assert 'Argument 1 to "route_and_enqueue" has incompatible type "Connection[' in result.stdout
