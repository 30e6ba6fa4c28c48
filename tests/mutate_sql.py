"""Mutation testing of the SQL the queue's guarantees live in (`./dev mutate`; not part of CI).

mutmut mutates Python; the claim, ack, release, sweep, intake and routing rules are statements in
`shared/queries/*.sql`. This makes one small bug at a time in those statements — a lock that skips
no rows or is gone, a comparison one off, a condition inverted, a NOTIFY gone — runs the core tests against a
copy of the repository carrying that bug, and lists every bug no test noticed.

    python -m tests.mutate_sql [--files queue.sql,intake.sql] [--start N] [--max N] [--report PATH] [--list]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERIES = Path("shared/queries")
DEFAULT_FILES = ["queue.sql", "intake.sql", "orchestrators.sql", "notices.sql", "credentials.sql"]
# The core tests: fast enough to run once per mutant; the SIGKILL runs stay out (minutes each).
TESTS = [  # fastest first: with -x most mutants are caught in the first file
    "tests/test_queue.py",
    "tests/test_locks.py",
    "tests/test_model.py",
    "tests/test_request_path.py",
    "tests/test_longpoll.py",
    "tests/test_notices.py",
    "tests/test_concurrency.py",
    "tests/test_conversations.py",
    "tests/test_rerouting.py",
]
# A file whose statements are reached mostly through HTTP (dedupe, conversations, activities) is
# run against those tests, first: with -x a mutant they catch costs no run of the whole core.
TESTS_FOR = {
    "intake.sql": [
        "tests/test_http.py",
        "tests/test_conversations.py",
        "tests/test_locks.py",
        "tests/test_security.py",
        "tests/test_rerouting.py",
        "tests/test_queue.py",
        "tests/test_concurrency.py",
    ],
    "notices.sql": [
        "tests/test_notices.py",
        "tests/test_conversations.py",
        "tests/test_oauth.py",
        "tests/test_security.py",
        "tests/test_bad_input.py",
        "tests/test_rerouting.py",
    ],
    "orchestrators.sql": [*TESTS, "tests/test_security.py", "tests/test_operators.py"],
    "credentials.sql": ["tests/test_oauth.py", "tests/test_notices.py", "tests/test_security.py"],
}
DESELECT = "not sigkilled and not plan_probes"

CONDITION = re.compile(r"^\s*(WHERE|AND|OR|ON|WHEN|FILTER)\b|\bWHERE\b", re.IGNORECASE)


@dataclass(frozen=True)
class Mutant:
    file: str
    line: int  # 1-based
    original: str
    mutated: str
    operator: str

    def describe(self) -> str:
        return (
            f"{self.file}:{self.line} [{self.operator}] {self.original.strip()}  ->  {self.mutated.strip()}"
        )


def _code(line: str) -> str:
    return line.split("--", 1)[0]


# (operator, text, replacement): everywhere, and in conditions only (a WHERE/AND/ON line).
ANYWHERE = [
    ("lock skips nothing", " SKIP LOCKED", ""),
    ("no row lock", "FOR UPDATE SKIP LOCKED", ""),
    ("null check inverted", "IS NULL", "IS NOT NULL"),
    ("null check inverted", "IS NOT NULL", "IS NULL"),
    ("exists inverted", "NOT EXISTS", "EXISTS"),
    ("count off by one", "+ 1", "+ 0"),
    ("least/greatest", "least(", "greatest("),
    ("least/greatest", "greatest(", "least("),
    ("limit off by one", "LIMIT %(max)s", "LIMIT %(max)s + 1"),
    ("order reversed", " DESC", " ASC"),
]
IN_CONDITIONS = [
    ("comparison", " <= ", " < "),
    ("comparison", " >= ", " > "),
    ("comparison", " < ", " <= "),
    ("comparison", " > ", " >= "),
    ("equality inverted", " = ", " <> "),
    ("and -> or", " AND ", " OR "),
]


def _swaps(line: str) -> Iterator[tuple[str, str]]:
    code = _code(line)
    if not code.strip():
        return
    swaps = ANYWHERE + (IN_CONDITIONS if CONDITION.search(code) else [])
    for op, old, new in swaps:
        start = 0
        while (i := code.find(old, start)) >= 0:
            if not (old == " < " and code[i : i + 3] == " <>"):  # (" <> " is not a comparison to flip)
                yield op, line[:i] + new + line[i + len(old) :]
            start = i + len(old)
    lock = code.strip()
    if lock.rstrip(";") in ("FOR UPDATE", "FOR KEY SHARE"):  # a lock that orders two statements
        yield "no row lock", ";" if lock.endswith(";") else ""
    order = re.search(r"\s*ORDER BY (\w+\.)?seq\b", code)
    if order:  # the queue order that rows are locked in (a deadlock with the sweep without it)
        yield "lock order removed", line[: order.start()] + line[order.end() :]
    notify = re.search(r"pg_notify\((?:[^()]|\([^()]*\))*\)", code)
    if notify:
        yield "notify removed", line[: notify.start()] + "NULL" + line[notify.end() :]


def mutants(files: list[str]) -> list[Mutant]:
    out: list[Mutant] = []
    for name in files:
        lines = (ROOT / QUERIES / name).read_text().splitlines(keepends=True)
        for n, line in enumerate(lines, 1):
            for op, mutated in _swaps(line):
                if mutated != line:
                    out.append(Mutant(name, n, line, mutated, op))
    return out


def _copy(dest: Path) -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in tracked.stdout.splitlines():
        src = ROOT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def run(files: list[str], start: int, limit: int | None, report: Path) -> int:
    found = mutants(files)[start - 1 :]
    found = found[:limit] if limit else found
    work = Path(tempfile.mkdtemp(prefix="devpilot-mutate-"))
    _copy(work)
    env = {**os.environ, "PYTHONPATH": str(work), "PYTHONDONTWRITEBYTECODE": "1"}
    base = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--timeout", "120"]
    tests = list(dict.fromkeys(t for f in files for t in TESTS_FOR.get(f, TESTS)))
    cmd = [*base, *tests, "-k", DESELECT]
    print(
        f"{len(found)} mutants of {', '.join(files)}; tests: {' '.join(tests)} (-k '{DESELECT}')", flush=True
    )
    clean = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if clean.returncode != 0:
        print(clean.stdout[-3000:], file=sys.stderr)
        print("the tests fail without any mutant: fix that first", file=sys.stderr)
        return 2
    survived: list[Mutant] = []
    started = time.monotonic()
    for i, m in enumerate(found, 1):
        path = work / QUERIES / m.file
        original = path.read_text()
        lines = original.splitlines(keepends=True)
        lines[m.line - 1] = m.mutated
        path.write_text("".join(lines))
        began = time.monotonic()
        try:
            result = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        finally:
            path.write_text(original)
        killed = result.returncode != 0
        if not killed:
            survived.append(m)
        took = time.monotonic() - began
        print(
            f"[{i}/{len(found)}] {'killed  ' if killed else 'SURVIVED'} ({took:.0f}s) {m.describe()}",
            flush=True,
        )
    minutes = (time.monotonic() - started) / 60
    lines_out = [
        "# SQL mutants that no test noticed",
        "",
        f"{len(found)} mutants, {len(found) - len(survived)} killed, {len(survived)} survived "
        f"({minutes:.0f} min).",
        "",
        *[f"- {m.describe()}" for m in survived],
        "",
    ]
    report.write_text("\n".join(lines_out))
    print(f"\n{len(found) - len(survived)}/{len(found)} killed; survivors listed in {report}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutate_sql")
    ap.add_argument("--files", default=",".join(DEFAULT_FILES), help="query files under shared/queries")
    ap.add_argument(
        "--start", type=int, default=1, help="begin at this mutant (1-based, as --list numbers them)"
    )
    ap.add_argument("--max", type=int, default=None, help="stop after this many mutants")
    ap.add_argument("--report", type=Path, default=ROOT / "mutation-sql.md")
    ap.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = ap.parse_args()
    files = [f.strip() for f in args.files.split(",") if f.strip()]
    if args.list:
        for i, m in enumerate(mutants(files), 1):
            print(f"{i}. {m.describe()}")
        return 0
    return run(files, args.start, args.max, args.report)


if __name__ == "__main__":
    raise SystemExit(main())
