"""JSON from clients: parsed, or refused with a reason (answered 400) — never a 500.

Postgres text and jsonb cannot hold U+0000, so such input is refused, not half-stored; and nesting
deeper than any real payload is refused before anything recurses over it (Python's parser raises
RecursionError on very deep input, which would otherwise surface as a server error)."""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


class BadJson(ValueError):
    """Not JSON we take; the message says why."""


def load(data: bytes) -> Any:
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadJson("body is not valid JSON") from None
    except RecursionError:
        raise BadJson(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    if b"\\u0000" not in data and b"\x00" not in data and data.count(b"{") + data.count(b"[") <= MAX_DEPTH:
        # Nothing to walk for: the parser refuses a raw control character in a string, so in UTF-8
        # a NUL arrives only as the escape \u0000 (a NUL byte means UTF-16 or -32: walked), and no
        # value nests deeper than the brackets it has. Most bodies are this case, and skip the walk.
        return value
    # Walk without recursion: depth and NUL checks over the whole value.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise BadJson("strings must not contain NUL (U+0000)")
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise BadJson(f"JSON nested deeper than {MAX_DEPTH} levels")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return value
