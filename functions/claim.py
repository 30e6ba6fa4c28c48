"""`claim` target: the poll route (POST /claim).

This is the fallback transport AND the reconnect sweep: a first-class route, not the sad path. It
is fully correct with Realtime disabled and SUPABASE_JWT_SECRET unset, because the delivery
guarantee lives in the queue table, not in a socket; push only tells a machine to come here sooner.
With `waitSeconds` it long-polls: it registers for this orchestrator's wake-ups on the instance's
single LISTEN connection, and re-checks the table at least every few seconds in any case.
"""

from __future__ import annotations

import time

import flask
import functions_framework

from functions.bodies import ClaimBody
from functions.runtime import Runtime
from functions.telemetry import CLAIMED
from functions.web import handler, json_body, note, reply, require_method, require_orchestrator
from shared import queue
from shared.models import TaskDispatchMessage

RECHECK_SECONDS = 5.0  # the polling backstop inside a long-poll, should a NOTIFY be lost


@functions_framework.http
@handler("claim")
def claim(request: flask.Request, rt: Runtime) -> flask.Response:
    require_method(request, "POST")
    orch = require_orchestrator(request, rt)
    body = json_body(request, ClaimBody, empty_ok=True)
    queue.touch_orchestrator(rt.pool, orch.id)

    def take() -> list[TaskDispatchMessage]:
        return queue.claim(rt.pool, orch.id, max=body.max, lease_seconds=rt.settings.lease_seconds)

    if body.wait_seconds == 0:
        messages = take()
    else:
        deadline = time.monotonic() + body.wait_seconds
        with rt.wakeups.waiter(str(orch.id)) as woken:
            rt.wakeups.wait_until_listening(timeout=min(2.0, body.wait_seconds))
            messages = take()
            while not messages:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                woken.wait(min(left, RECHECK_SECONDS))
                woken.clear()
                messages = take()
    CLAIMED.inc(len(messages))
    if messages:
        note(queueId=",".join(str(m.queue_id) for m in messages[:5]), claimed=len(messages))
    return reply({"messages": [m.wire() for m in messages]})
