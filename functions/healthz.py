"""`healthz` (GET /healthz): 200 when the database answers, 503 with Retry-After when not, within
DEVPILOT_HEALTHZ_DEADLINE_SECONDS whatever the database does (its own connection, never the
pool's: `shared.plumbing.health`)."""

from __future__ import annotations

import flask

from functions.web import Call, error, reply


def healthz(call: Call) -> flask.Response:
    if not call.rt.health.ok():
        return error(503, "db_unavailable", "the database did not answer", {"Retry-After": "5"})
    return reply({"ok": True})
