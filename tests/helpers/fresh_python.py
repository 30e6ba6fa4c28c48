"""Code run in a fresh interpreter at the repository's root (a cold instance, what an import
loads), answering with JSON on its last line of output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_json(code: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """`python -c code args...` (with `env`, else this process's environment): its last line of
    output, read as JSON. A non-zero exit fails the caller (CalledProcessError)."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
