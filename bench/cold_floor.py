"""The framework's floor of a cold start (bench/coldstart.py): a functions-framework target that
imports what every target needs (`functions_framework` comes with the framework's command, then
psycopg and psycopg_pool) and, on its first request, opens one database connection and runs one
statement. What every target does before anything of ours: the framework's server (gunicorn's
import, its arbiter, the worker's fork), one request through it, and the first connection. Nothing
of this project is imported here.
"""

from __future__ import annotations

import os

import flask
import psycopg
import psycopg_pool  # noqa: F401  (every target imports it: the same imports as the bare import)


def floor(request: flask.Request) -> str:
    """One connection, one statement, a plain answer."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT 1").fetchone()
    return "ok"
