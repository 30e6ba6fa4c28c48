"""Loads `queries.sql` into named statements (one `-- name:` block each)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import LiteralString

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Split a queries file into {name: statement}; the header comments stay with their query."""
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} defined twice")
        queries[name] = body.strip()
    return queries


@cache
def _load(path: str) -> dict[str, str]:
    return parse(Path(path).read_text(encoding="utf-8"))


QUERIES = str(Path(__file__).with_name("queries.sql"))


def query(name: str, path: str = QUERIES) -> LiteralString:
    """The named statement from shared/queries.sql (a file we ship, hence LiteralString)."""
    text: LiteralString = _load(path)[name]
    return text
