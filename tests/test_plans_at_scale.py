"""Every statement the service sends, planned beside 100,000 kept sessions: none reads a table that
grows with what is kept (sessions and their parts, posts to Linear, routing requests, delivery
records) whole. A year of data (`bench.year.seed`, as `bench.statements --sessions` times it at
10,000,000) and what the service does with it (`bench.year.workload`: the webhooks, the machines'
calls, the sweep with its retention, the dashboard and `devpilot status`, a metrics scrape, a
session's page, each search, each operator's action, a revoke); each named statement sent is then
planned again with the values it was sent with, as the plan Postgres keeps for every value (the
generic plan) and as one planned for those values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.sql
import pytest
from pytest_httpserver import HTTPServer

from bench.year import seed, workload
from shared.plumbing.db import open_pool
from shared.plumbing.sql import load, query_with_limit
from tests.helpers.data import api_settings
from tests.helpers.linear import Linear
from tests.helpers.plans import GROWING, explain, nodes

SESSIONS = 100_000


def outline(node: dict[str, Any], depth: int = 0) -> str:
    """A plan as EXPLAIN's text shows it, roughly: one line per node."""
    what = " ".join(
        str(node[k])
        for k in ("Node Type", "Relation Name", "Index Name", "Index Cond", "Filter")
        if k in node
    )
    return "\n".join(["  " * depth + what] + [outline(c, depth + 1) for c in node.get("Plans", [])])


class Sent:
    """The first values each named statement was sent with (psycopg's Cursor.execute, wrapped)."""

    def __init__(self) -> None:
        texts = load()
        self.names = {text: name for name, text in texts.items()}
        for name, text in texts.items():  # (the claims' LIMIT is written in: each ceiling's text)
            if "%(max_ceiling)s" in text:
                for k in range(11):
                    self.names[query_with_limit(name, 1 << k)] = name
        self.first: dict[str, tuple[str, dict[str, Any]]] = {}
        self._original = psycopg.Cursor.execute

    def __enter__(self) -> Sent:
        original, names, first = self._original, self.names, self.first

        def seen(cur: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            name = names.get(query) if isinstance(query, str) else None
            if name is not None and name not in first and isinstance(params, dict | None):
                first[name] = (query, dict(params or {}))
            return original(cur, query, params, **kw)

        psycopg.Cursor.execute = seen  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        psycopg.Cursor.execute = self._original  # type: ignore[method-assign]


@pytest.fixture
def sent(db_url: str, httpserver: HTTPServer) -> Iterator[tuple[str, dict[str, tuple[str, dict[str, Any]]]]]:
    Linear(httpserver)  # (the posts after each commit go to the stand-in)
    settings = api_settings(
        LINEAR_API_URL=httpserver.url_for("/graphql"),
        DEVPILOT_STATEMENT_TIMEOUT_MS=600_000,
        DEVPILOT_SWEEP_DEADLINE_SECONDS=600,
        DEVPILOT_REQUEST_DEADLINE_SECONDS=60,
    )
    pool = open_pool(db_url, settings, max_size=6)
    try:
        year = seed(pool, settings, SESSIONS, dense=True)
        with Sent() as s:
            workload(pool, settings, year)
        yield db_url, s.first
    finally:
        pool.close()


def test_no_statement_reads_a_growing_table_whole(
    sent: tuple[str, dict[str, tuple[str, dict[str, Any]]]],
) -> None:
    """Each statement is run again (EXPLAIN ANALYZE, in a transaction rolled back) with the values it
    was sent with, in both plan modes: no scan of a growing table is sequential, and none reads a
    tenth of one (a whole index read in order is as slow as the table). A statement that cannot run
    again (its insert's key is taken now) is checked by its plan alone."""
    url, first = sent
    assert len(first) > 40, sorted(first)  # (the workload reached what the service does)
    for expected in ("retention_pick", "retention_forget", "status_totals", "session_search", "notice_take"):
        assert expected in first, expected
    assert "issue_changes_for_delivery" in first  # (a re-assignment's, an unassignment's)
    for expected in (
        "take_turns",
        "routing_cancel_agent_session",
        "cancel_agent_session",
        "record_stop",
        "stop_for_delivery",
    ):
        assert expected in first, expected  # (a stop's)
    found: list[str] = []
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row, autocommit=True) as conn:
        _analyze_as_autovacuum_would(conn)
        sizes = {
            r["relname"]: r["reltuples"]
            for r in conn.execute(
                "SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s)", (list(GROWING),)
            )
        }
        assert all(sizes[t] >= 10_000 for t in GROWING), sorted(sizes.items())  # (read as they become)
        table_of = {
            r["indexname"]: r["tablename"]
            for r in conn.execute(
                "SELECT indexname, tablename FROM pg_indexes WHERE tablename = ANY(%s)", (list(GROWING),)
            )
        }
        for name, (text, params) in sorted(first.items()):
            if not text.lstrip().upper().startswith(("SELECT", "WITH", "INSERT", "UPDATE", "DELETE")):
                continue  # (SET, LISTEN: nothing to plan)
            for mode in ("force_generic_plan", "force_custom_plan"):
                plan = _run_again(conn, text, params, mode)
                for n in nodes(plan):
                    table = n.get("Relation Name") or table_of.get(n.get("Index Name", ""))
                    if table not in GROWING or not n["Node Type"].endswith("Scan"):
                        continue
                    read = (
                        n.get("Actual Rows", 0)
                        + n.get("Rows Removed by Filter", 0)
                        + n.get("Rows Removed by Index Recheck", 0)
                    ) * n.get("Actual Loops", 1)
                    if n["Node Type"] == "Seq Scan" or read > sizes[table] / 10:
                        found.append(f"{name} ({mode}): reads {read:.0f} rows of {table}:\n{outline(plan)}")
    assert not found, "\n".join(found)


def _analyze_as_autovacuum_would(conn: Any) -> None:
    """Statistics as autovacuum leaves them, not as its runs during the workload happened to end:
    every table that holds rows analyzed, an empty one never (a workspace without repository
    routing has no `machine_inventories`). A plan can flip with them: `reroute_quiet_pick`'s
    generic plan hashed every start session once `orchestrators` had been analyzed and
    `machine_inventories` had not."""
    tables = [
        r["relname"]
        for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
        )
    ]
    for table in tables:
        name = psycopg.sql.Identifier(table)
        if conn.execute(psycopg.sql.SQL("SELECT EXISTS (SELECT FROM {})").format(name)).fetchone()["exists"]:
            conn.execute(psycopg.sql.SQL("ANALYZE {}").format(name))


def _run_again(conn: Any, text: str, params: dict[str, Any], mode: str) -> dict[str, Any]:
    """The statement's plan, run (and rolled back); planned only when it cannot run again."""
    errors: list[str] = []
    for options in ("ANALYZE, BUFFERS", "COSTS"):
        try:
            with conn.transaction():
                plan = explain(conn, text, params, mode=mode, options=options)
                raise psycopg.Rollback  # (the block ends here, rolled back: psycopg takes the exception)
            return dict(plan["QUERY PLAN"][0]["Plan"])
        except psycopg.Error as exc:
            errors.append(str(exc))
            conn.execute("DEALLOCATE ALL")  # (a PREPARE outlives the transaction that failed)
    raise AssertionError(f"cannot plan {text[:200]}: {errors}")
