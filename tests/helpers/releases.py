"""The code as it was before a migration: for the tests of upgrades on a live database.

A rolling deploy runs the new migrations first, while the instances of the release before keep
serving, and replaces those instances afterwards. So the code before each new migration must work
on the schema after it. `before_each_migration` names those releases from the repository's history
(read-only: `git log`, `git archive`), and `checkout` writes one out beside the tests.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
FIRST_UNRELEASED = 20  # migrations from 0020 on came after the release these tests upgrade from


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def before_each_migration() -> list[str]:
    """The commit before each migration numbered FIRST_UNRELEASED or more was added, oldest first,
    each once (the first is the release these migrations upgrade). Empty when the history is not
    there (a shallow clone, no git): the tests that need it are skipped then."""
    try:
        paths = sorted(
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / "infra" / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql")
            if int(p.name[:4]) >= FIRST_UNRELEASED
        )
        commits: list[str] = []
        for path in paths:
            added = _git("log", "--diff-filter=A", "--format=%H", "--", path).splitlines()
            if not added:  # (not committed yet: the working tree's)
                continue
            before = _git("rev-parse", f"{added[-1]}^")
            if before not in commits:
                commits.append(before)
        return commits
    except (OSError, subprocess.SubprocessError, ValueError):
        return []


def checkout(commit: str, dest: Path, *, new_schema: bool) -> Path:
    """`commit`'s tree written to `dest` (`git archive`: nothing in the repository changes).
    `new_schema`: with today's migrations and migration runner in it, so whatever it migrates
    (its own test databases) gets the schema after them, as in the window of a rolling deploy."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True, timeout=120
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    if new_schema:
        for p in (ROOT / "infra" / "migrations").glob("*.sql"):
            shutil.copy2(p, dest / "infra" / "migrations" / p.name)
        shutil.copy2(ROOT / "shared/queries/database.sql", dest / "shared/queries/database.sql")
        runner = dest / migrate_module(dest).replace(".", "/")
        text = (ROOT / "shared/plumbing/migrate.py").read_text(encoding="utf-8")
        if not (dest / "shared" / "plumbing").is_dir():  # (before shared/ had rooms: all of it flat)
            text = text.replace("from shared.plumbing.", "from shared.")
        runner.with_suffix(".py").write_text(text, encoding="utf-8")
    return dest


def migrate_module(tree: Path) -> str:
    """The migration runner's module in `tree`: in its room, or where it stood before shared/ had rooms."""
    return "shared.plumbing.migrate" if (tree / "shared" / "plumbing").is_dir() else "shared.migrate"
