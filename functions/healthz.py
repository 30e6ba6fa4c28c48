"""`healthz` target (GET /healthz): 200 when the database answers, 503 with Retry-After when not."""

from __future__ import annotations

import flask
import functions_framework
import psycopg
import psycopg_pool

from functions.runtime import Runtime
from functions.web import error, handler, reply, require_method

PING = "SELECT 1"


@functions_framework.http
@handler("healthz")
def healthz(request: flask.Request, rt: Runtime) -> flask.Response:
    require_method(request, "GET", "HEAD")
    try:
        with rt.pool.connection(timeout=3.0) as conn:
            conn.execute(PING)
    except (psycopg.Error, psycopg_pool.PoolTimeout):
        return error(503, "db_unavailable", "the database did not answer", {"Retry-After": "5"})
    return reply({"ok": True})
