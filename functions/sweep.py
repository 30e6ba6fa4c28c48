"""`sweep` target (POST /sweep, admin bearer): re-queue expired leases, dead-letter at the limit.

Also the scheduled entry point: `run_sweep()` is what Cloud Scheduler / EventBridge end up calling.
Safe to run concurrently and repeatedly (see shared.queue.sweep).
"""

from __future__ import annotations

import json
import logging

import flask
import functions_framework

from functions.runtime import Runtime, get_runtime
from functions.telemetry import DEAD, REQUEUED, SWEEP_SECONDS
from functions.web import handler, reply, require_admin, require_method
from shared import notices, queue

log = logging.getLogger("devpilot.sweep")


def run_sweep() -> dict[str, int]:
    rt = get_runtime()
    with SWEEP_SECONDS.time():
        result = queue.sweep(rt.pool, rt.settings)
    REQUEUED.inc(result.requeued)
    DEAD.inc(result.dead_lettered)
    # Linear notices still unsent (Linear was down, or an instance died between commit and send).
    sent = notices.send_pending(rt.pool, rt.settings)
    if sent.sent or sent.failed:
        log.info(json.dumps({"event": "notices", "sent": sent.sent, "failed": sent.failed}))
    return {"requeued": result.requeued, "deadLettered": result.dead_lettered}


@functions_framework.http
@handler("sweep")
def sweep(request: flask.Request, rt: Runtime) -> flask.Response:
    require_method(request, "POST")
    if not rt.settings.sweep_platform_auth:
        require_admin(request, rt)
    return reply(run_sweep())
