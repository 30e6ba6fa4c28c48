"""The commit-subject limit `./dev lint` holds (tests/commit_subjects.py), on a repository of the
test's own: a subject over 72 characters after the base fails it, one before the base does not,
and a checkout without the base (a shallow clone) is not checked."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.commit_subjects import MAX_CHARS, long_subjects, main
from tests.helpers.git import checkout


def commit(repo: Path, subject: str) -> str:
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", subject], cwd=repo, check=True)
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_only_subjects_after_the_base_are_held_to_the_limit(tmp_path: Path) -> None:
    repo = checkout(tmp_path / "r")
    commit(repo, "x" * 100)  # published history, before the base: left as it is
    base = commit(repo, "the base")
    commit(repo, "é" * MAX_CHARS)  # characters, not bytes
    assert long_subjects(repo, base) == []
    assert main(["--repo", str(repo), "--base", base]) == 0

    commit(repo, "y" * (MAX_CHARS + 1))
    (found,) = long_subjects(repo, base) or [""]
    assert found.endswith(" " + "y" * (MAX_CHARS + 1))
    assert main(["--repo", str(repo), "--base", base]) == 1


def test_a_checkout_without_the_base_is_not_checked(tmp_path: Path) -> None:
    repo = checkout(tmp_path / "r")
    commit(repo, "z" * 100)
    missing = "0123456789abcdef0123456789abcdef01234567"
    assert long_subjects(repo, missing) is None
    assert main(["--repo", str(repo), "--base", missing]) == 0


def test_a_merge_is_not_held_to_it(tmp_path: Path) -> None:
    """A merge's subject is often a tool's (a CI's merge of a pull request names two hashes): the
    commits it brings in are checked, not it."""
    repo = checkout(tmp_path / "r")
    base = commit(repo, "the base")
    subprocess.run(["git", "checkout", "-q", "-b", "side"], cwd=repo, check=True)
    commit(repo, "a change")
    subprocess.run(["git", "checkout", "-q", "-"], cwd=repo, check=True)
    commit(repo, "another change")
    long = "Merge " + "m" * MAX_CHARS
    subprocess.run(["git", "merge", "-q", "--no-ff", "-m", long, "side"], cwd=repo, check=True)
    assert long_subjects(repo, base) == []
