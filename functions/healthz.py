"""`healthz` (GET /healthz): 200 when the database answers, 503 with Retry-After when not."""

from __future__ import annotations

import flask
import psycopg
import psycopg_pool

from functions.web import Call, error, reply
from shared.sql import query


def healthz(call: Call) -> flask.Response:
    try:
        with call.rt.pool.connection(timeout=3.0) as conn:
            conn.execute(query("ping"))
    except (psycopg.Error, psycopg_pool.PoolTimeout):
        return error(503, "db_unavailable", "the database did not answer", {"Retry-After": "5"})
    return reply({"ok": True})
