"""The plan Postgres runs a statement with, for the plan tests, in either plan-cache mode.

`EXPLAIN` of a statement with bound values plans those values in: a custom plan, whatever
`plan_cache_mode` says, even when psycopg prepares the EXPLAIN. The plan a prepared statement keeps
for every value (the generic plan, which the service's statements run on after their first five
executions) is seen only through a statement prepared at the SQL level: `PREPARE`, then `EXPLAIN
EXECUTE` under `force_generic_plan`. `explain` does that for both modes, so each mode's test sees the
plan of that mode.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg import sql
from psycopg.adapt import PyFormat, Transformer

from shared.plumbing.db import Conn

_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def explain(
    conn: Conn, statement: str, params: dict[str, Any], *, mode: str, options: str = "ANALYZE, BUFFERS"
) -> dict[str, Any]:
    """EXPLAIN (`options`, FORMAT JSON) of `statement` (psycopg's `%(name)s` placeholders) with
    `params`, planned under `mode` (`force_generic_plan` or `force_custom_plan`), in the caller's
    transaction: its first row. Each parameter is typed as psycopg types it when it sends it."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, statement).replace("%%", "%")
    tx = Transformer(conn)
    types = []
    for name in names:
        value = params[name]
        # (A list's dumper is specialised on its elements: `upgrade` gives the array's type.)
        oid = 0 if value is None else tx.get_dumper(value, PyFormat.AUTO).upgrade(value, PyFormat.AUTO).oid
        info = conn.adapters.types.get(oid)  # (an array's oid finds its element's type)
        name = "unknown" if info is None else info.regtype + ("[]" if oid == info.array_oid else "")
        types.append(sql.SQL(name))
    conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
    # (A statement without parameters is prepared and executed without the parentheses.)
    typed = sql.SQL("({})").format(sql.SQL(", ").join(types)) if names else sql.SQL("")
    conn.execute(sql.SQL("PREPARE devpilot_plan_probe {} AS {}").format(typed, sql.SQL(text)))
    try:
        args = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
        given = sql.SQL("({})").format(args) if names else sql.SQL("")
        row = conn.execute(
            sql.SQL("EXPLAIN ({}, FORMAT JSON) EXECUTE devpilot_plan_probe {}").format(
                sql.SQL(options), given
            )
        ).fetchone()
    finally:
        conn.execute("DEALLOCATE devpilot_plan_probe")
    assert row is not None
    return dict(row)


def nodes(n: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN FORMAT JSON plan, `n` first."""
    return [n, *(m for child in n.get("Plans", []) for m in nodes(child))]


# The tables that grow with what is kept (sessions and their parts, posts to Linear, routing
# requests, delivery records); the others hold live work, or a row per machine or workspace.
GROWING = (
    "dispatch_sessions",
    "linear_notices",
    "routing_requests",
    "dispatch_attempts",
    "dead_letters",
    "session_actions",
    "webhook_deliveries",
    "agent_session_stops",
)
