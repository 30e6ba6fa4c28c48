"""`--worktree`: each conversation edits its own git worktree, never the checkout another uses.

A worktree is made when a conversation's first COMMAND starts, on a branch of its own
(`devpilot/<issue identifier>-<conversation>`, so what the agent commits outlives the worktree), from the repository's
current HEAD; every later COMMAND of the conversation runs in it; it is removed when the
conversation ends (a final `response` or `error`, or Linear's stop). A worktree with changes nobody
committed is kept, and the orchestrator says so: removing it would throw the agent's work away.
Its branch goes with it when nothing is on it that the checkout's HEAD does not have (`git branch
-d`: no commits of its own, or all of them merged); a branch with commits stays.
A conversation that continues after its worktree was removed gets it again, on its branch (or on a
new one from HEAD when its branch had nothing on it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple


class WorktreeError(RuntimeError):
    """git could not make the worktree (the message says why)."""


def toplevel(path: Path) -> Path | None:
    """The git checkout `path` is in, or None when it is in none."""
    r = _git(path, "rev-parse", "--show-toplevel")
    return Path(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None


def ensure(repo: Path, where: Path, branch: str) -> Path:
    """The conversation's worktree at `where`, made from `repo` if it is not there yet: on `branch`
    if that exists (a conversation resumed after its worktree was removed), else a new `branch`
    from HEAD."""
    if (where / ".git").exists():
        return where
    where.parent.mkdir(parents=True, exist_ok=True)
    _git(repo, "worktree", "prune")  # forget a worktree whose folder is gone
    has_branch = _git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}").returncode == 0
    args = (
        ["worktree", "add", str(where), branch]
        if has_branch
        else ["worktree", "add", "-b", branch, str(where)]
    )
    r = _git(repo, *args)
    if r.returncode != 0:
        raise WorktreeError(r.stderr.strip() or r.stdout.strip())
    return where


class Removed(NamedTuple):
    kept: str | None  # why the worktree was kept; None: removed (or already gone)
    branch: str | None = None  # its branch, left in place: it has commits of its own


def remove(repo: Path, where: Path) -> Removed:
    """Remove the worktree when nothing in it is uncommitted, and its branch when nothing is on it
    that `repo`'s HEAD does not have."""
    if not where.exists():
        _git(repo, "worktree", "prune")
        return Removed(None)
    status = _git(where, "status", "--porcelain")
    if status.returncode != 0:
        return Removed(status.stderr.strip() or "git status failed")
    if status.stdout.strip():
        return Removed("it has changes nobody committed")
    head = _git(where, "symbolic-ref", "--quiet", "--short", "HEAD")  # (none: a detached HEAD)
    branch = head.stdout.strip() if head.returncode == 0 else ""
    r = _git(repo, "worktree", "remove", str(where))
    if r.returncode != 0:
        return Removed(r.stderr.strip() or "git worktree remove failed")
    # `-d`, never `-D`: git itself refuses a branch with commits HEAD does not have.
    if branch and _git(repo, "branch", "-d", branch).returncode != 0:
        return Removed(None, branch)
    return Removed(None)


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    git = shutil.which("git")
    if git is None:
        raise WorktreeError("git is not installed (--worktree needs it)")
    return subprocess.run(
        [git, "-C", str(cwd), *args], capture_output=True, text=True, check=False, timeout=60
    )
