"""The pinned Claude Code CLI for the demo and the tests: installed with npm into a cache folder of
its own (reused by every later run), never over a `claude` the person has on PATH.

`python -m devpilot.claude_code` installs it (CI does, before the tests) and prints its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.runners.claude import PINNED

PACKAGE = f"@anthropic-ai/claude-code@{PINNED}"


class Unavailable(RuntimeError):
    """The pinned CLI is not here and cannot be installed (the message says why)."""


def folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "devpilot" / f"claude-code-{PINNED}"


def installed() -> Path | None:
    """The pinned CLI, if installed (its `claude` works and says its version)."""
    cli = folder() / "node_modules" / ".bin" / "claude"
    if not cli.exists():
        return None
    try:
        said = subprocess.run(
            [str(cli), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cli if said.returncode == 0 and said.stdout.startswith(PINNED) else None


def install() -> Path:
    """The pinned CLI, installed now if it is not yet (one installer at a time: a lock file)."""
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(f"npm is not installed: the tests and the demo need it for {PACKAGE}")
    home = folder()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = installed()
            if found is not None:
                return found
            done = subprocess.run(
                [npm, "install", "--prefix", str(home), "--no-audit", "--no-fund", "--no-save", PACKAGE],
                capture_output=True,
                text=True,
                timeout=900,
                check=False,
            )
            found = installed()
            if found is None:
                tail = (done.stderr or done.stdout).strip()[-800:]
                raise Unavailable(f"npm could not install {PACKAGE}: {tail}")
            return found
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    try:
        print(install())
    except Unavailable as exc:
        print(f"devpilot: {exc}", file=sys.stderr)
        sys.exit(1)
