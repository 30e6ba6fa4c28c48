"""Every SQL statement of the product lives in `shared/queries/*.sql`, one named block each:

    -- name: claim
    -- what the statement guarantees
    WITH due AS (...)

A line `-- include: <name>` is replaced by that named block (a shared CTE chain, written once).
Names are unique across the files; `query(name)` returns the statement.

The comments are for the reader of the file; the statement sent leaves out every line that is only
a comment. psycopg converts a statement's `%(name)s` placeholders once and keeps the result only
for a statement of at most 4,096 bytes (`MAX_CACHED_STATEMENT_LENGTH`); longer ones it converts
again, with a regular expression, on every execution. With its comments the webhook's one
statement was over that limit, and converting it again on every webhook was a large part of the
webhook's CPU (bench/README.md, "What was tried").
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from pathlib import Path
from typing import LiteralString

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^-- include: (\w+)\s*$", re.MULTILINE)
FOLDER = Path(__file__).parent.parent / "queries"  # shared/queries/, every room's


class QueryFileError(ValueError):
    """A queries file is malformed: a name defined twice, or an include of an unknown block."""


def parse(text: str, into: dict[str, str] | None = None) -> dict[str, str]:
    """Split queries text into {name: statement} (added to `into`). Includes are resolved, and
    comment lines left out, by `resolve`, once every file is read."""
    queries = {} if into is None else into
    parts = _HEADER.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise QueryFileError(f"query {name!r} defined twice")
        queries[name] = body.strip()
    return queries


def resolve(queries: dict[str, str]) -> dict[str, str]:
    """Every statement of `queries` with its includes resolved and its comment lines left out."""
    return {name: resolve_one(queries, name) for name in queries}


def resolve_one(queries: dict[str, str], name: str) -> str:
    """The statement `name` of `queries` with its includes resolved and its comment lines left out
    (KeyError: no such statement)."""

    def expand(name: str, seen: tuple[str, ...]) -> str:
        if name in seen:
            raise QueryFileError(f"query {name!r} includes itself")

        def one(m: re.Match[str]) -> str:
            if m.group(1) not in queries:
                raise QueryFileError(f"query {name!r} includes unknown {m.group(1)!r}")
            return expand(m.group(1), (*seen, name))

        return _INCLUDE.sub(one, queries[name])

    return _without_comment_lines(expand(name, ()))


def _without_comment_lines(statement: str) -> str:
    """The statement as sent: without its comment lines, each line without its indentation (both
    for people, and psycopg keeps a statement's converted placeholders only up to 4,096 bytes)."""
    return "\n".join(
        line.strip() for line in statement.splitlines() if line.strip() and not line.lstrip().startswith("--")
    )


@cache
def blocks(folder: Path = FOLDER) -> dict[str, str]:
    """Every named block of the files, as written (read and split once; a name defined twice in
    any of them raises here)."""
    queries: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        parse(path.read_text(encoding="utf-8"), into=queries)
    return queries


@cache
def load(folder: Path = FOLDER) -> dict[str, str]:
    """Every statement of the files, resolved."""
    return resolve(blocks(folder))


@cache
def _statement(name: str) -> str:
    # Resolved on first use, one statement at a time: a cold instance's first request needs one or
    # two, and resolving all of them (load) was a visible part of it (bench/README.md, "Cold start").
    return resolve_one(blocks(), name)


def query(name: str) -> LiteralString:
    """The named statement (from files we ship, hence LiteralString)."""
    text: LiteralString = _statement(name)
    return text


@lru_cache(maxsize=64, typed=True)  # (typed: True is not 1 here)
def query_with_limit(name: str, limit: int) -> LiteralString:
    """The named statement with its one `%(max_ceiling)s` written in as a number, not bound: the
    smallest power of two at least `limit` (the LIMIT of the claim's candidates, `claimable` in
    queue.sql, whose own `%(max)s` stays bound).

    Postgres plans a prepared statement afresh at each execution (a custom plan) unless the plan
    it would keep for every value (the generic plan) costs about as much. A LIMIT it cannot see
    makes the generic plan assume a tenth of the rows, so the claim was planned at every
    execution; with a ceiling in sight the plans cost the same, and it is planned once per
    connection and ceiling: a handful of statements (1 to 1,024: eleven), not one per batch size
    (bench/README.md). `limit` must be an int of at least 1 (the caller checks its range):
    nothing but digits reaches the text."""
    if type(limit) is not int:
        raise TypeError(f"a LIMIT is an int, not {type(limit).__name__}")
    if limit < 1:
        raise ValueError("a LIMIT is at least 1")
    head, found, tail = query(name).partition("%(max_ceiling)s")
    if not found or "%(max_ceiling)s" in tail:
        raise QueryFileError(f"query {name!r} must have exactly one %(max_ceiling)s")
    # (Still a statement of ours: an int's digits are all that is added.)
    return f"{head}{1 << (limit - 1).bit_length()}{tail}"
