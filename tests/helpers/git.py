"""A git checkout of the tests' own, for an orchestrator to run in (its `--repo`, `--worktree`)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def checkout(path: Path, origin: str | None = None) -> Path:
    """A new repository at `path` with one commit (a README holding the folder's name), and
    `origin` as its remote when given."""
    path.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "t@example.com"],
        ["config", "user.name", "T"],
        *([["remote", "add", "origin", origin]] if origin else []),
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    (path / "README").write_text(f"{path.name}\n")
    subprocess.run(["git", "add", "README"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "first"], cwd=path, check=True)
    return path.resolve()
