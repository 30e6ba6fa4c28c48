"""`release` target (POST /release): give a claim back now; it counts as a failed attempt, with
the same backoff and dead-lettering as an expired lease."""

from __future__ import annotations

import flask
import functions_framework

from functions.ack import DETAIL, STATUS
from functions.bodies import ReleaseBody, loose_uuid
from functions.runtime import Runtime
from functions.telemetry import DEAD, RELEASED
from functions.web import ApiError, handler, json_body, note, reply, require_method, require_orchestrator
from shared import queue


@functions_framework.http
@handler("release")
def release(request: flask.Request, rt: Runtime) -> flask.Response:
    require_method(request, "POST")
    orch = require_orchestrator(request, rt)
    body = json_body(request, ReleaseBody)
    note(queueId=body.queue_id)
    r = queue.release(
        rt.pool,
        rt.settings,
        orch.id,
        loose_uuid(body.queue_id),
        loose_uuid(body.claim_token),
        reason=body.reason,
    )
    if r.status != "released":
        raise ApiError(STATUS[r.status], r.status, DETAIL[r.status])
    RELEASED.inc()
    DEAD.inc(int(r.dead_lettered))
    rt.send_soon(list(r.notice_ids))
    return reply(
        {
            "status": "released",
            "availableAt": r.available_at.isoformat() if r.available_at else None,
            "deadLettered": r.dead_lettered,
        }
    )
