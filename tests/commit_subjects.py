"""Commit subjects at most 72 characters (`./dev lint`): every commit after BASE, up to HEAD, but
merges (their subject is often a tool's: a CI's merge of a pull request names two hashes).

    python -m tests.commit_subjects [--base REV] [--repo DIR]

Prints each longer subject and exits 1; exits 0, saying why, where there is nothing it can check:
no git, no checkout, or BASE not in it (a shallow CI clone, a tarball).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

# main's head when the limit came in. The ~470 longer subjects before it are published history
# and stay as they are, so only what comes after it is checked.
BASE = "61b197fd696b8be35f26782a2486ad0c07366146"
MAX_CHARS = 72


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    """git's answer, or None where there is no git to ask."""
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    except FileNotFoundError:
        return None


def long_subjects(repo: Path, base: str = BASE) -> list[str] | None:
    """`<short hash> <subject>` of each commit after `base` whose subject is longer than
    MAX_CHARS characters; None when `base` is not in this checkout."""
    found = git(repo, "cat-file", "-e", f"{base}^{{commit}}")
    if found is None or found.returncode != 0:
        return None
    log = git(repo, "log", "--no-merges", "--format=%h %s", f"{base}..HEAD")
    if log is None or log.returncode != 0:
        raise RuntimeError(f"git log failed: {log.stderr.strip() if log else 'no git'}")
    return [line for line in log.stdout.splitlines() if len(line.split(" ", 1)[-1]) > MAX_CHARS]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="commit_subjects", description=__doc__.splitlines()[0])
    p.add_argument("--base", default=BASE, help="the last commit not checked (default: %(default)s)")
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    args = p.parse_args(argv)
    long = long_subjects(args.repo, args.base)
    if long is None:
        print(
            f"commit subjects: not checked, {args.base[:12]} is not in this checkout (shallow? no git?)",
            file=sys.stderr,
        )
        return 0
    for line in long:
        print(f"commit subject over {MAX_CHARS} characters: {line}", file=sys.stderr)
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
