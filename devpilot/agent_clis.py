"""The agents' CLIs pinned for the demo and the tests (Claude Code, Codex): each installed with npm
into a cache folder of its own (reused by every later run), never over a CLI the person has on PATH.

`python -m devpilot.agent_clis [claude|codex]...` installs them (all by default; CI does, before the
tests) and prints where each is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.runners import claude, codex


class Unavailable(RuntimeError):
    """The pinned CLI is not here and cannot be installed (the message says why)."""


@dataclass(frozen=True)
class Pinned:
    name: str  # the command: `claude`, `codex`
    npm: str  # its npm package
    version: str  # the version the runner is tested with

    @property
    def package(self) -> str:
        return f"{self.npm}@{self.version}"

    def folder(self) -> Path:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(base) / "devpilot" / f"{self.npm.rsplit('/', 1)[-1]}-{self.version}"

    def installed(self) -> Path | None:
        """The pinned CLI, if installed (it runs and says its version)."""
        cli = self.folder() / "node_modules" / ".bin" / self.name
        if not cli.exists():
            return None
        try:
            said = subprocess.run(
                [str(cli), "--version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return cli if said.returncode == 0 and self.version in said.stdout.split() else None

    def install(self) -> Path:
        """The pinned CLI, installed now if it is not yet (one installer at a time: a lock file)."""
        npm = shutil.which("npm")
        if npm is None:
            raise Unavailable(f"npm is not installed: the tests and the demo need it for {self.package}")
        home = self.folder()
        home.mkdir(parents=True, exist_ok=True)
        with open(home / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                found = self.installed()
                if found is not None:
                    return found
                argv = [npm, "install", "--prefix", str(home), "--no-audit", "--no-fund", "--no-save"]
                done = subprocess.run(
                    [*argv, self.package], capture_output=True, text=True, timeout=900, check=False
                )
                found = self.installed()
                if found is None:
                    tail = (done.stderr or done.stdout).strip()[-800:]
                    raise Unavailable(f"npm could not install {self.package}: {tail}")
                return found
            finally:
                with contextlib.suppress(OSError):
                    fcntl.flock(lock, fcntl.LOCK_UN)


CLAUDE = Pinned("claude", "@anthropic-ai/claude-code", claude.PINNED)
CODEX = Pinned("codex", "@openai/codex", codex.PINNED)
PINNED = {cli.name: cli for cli in (CLAUDE, CODEX)}


def main(names: list[str]) -> int:
    code = 0
    for name in names or list(PINNED):
        if name not in PINNED:
            print(f"devpilot: no pinned CLI named {name} (there are: {', '.join(PINNED)})", file=sys.stderr)
            return 2
        try:
            print(PINNED[name].install())
        except Unavailable as exc:
            print(f"devpilot: {exc}", file=sys.stderr)
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
