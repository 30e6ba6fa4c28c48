"""`claim` (POST /claim): the poll route.

This is the fallback transport AND the reconnect sweep: a first-class route, not the sad path. It
is fully correct with Realtime disabled and SUPABASE_JWT_SECRET unset, because the delivery
guarantee lives in the queue table, not in a socket; push only tells a machine to come here sooner.
With `waitSeconds` it long-polls (shared.dispatch.Dispatch.claim).
"""

from __future__ import annotations

import flask

from functions.bodies import ClaimBody
from functions.telemetry import CLAIMED
from functions.web import ApiError, Call, note, reply
from shared.dispatch import Refused


def claim(call: Call) -> flask.Response:
    body = call.body(ClaimBody, empty_ok=True)
    try:
        messages = call.service.claim(call.orch.id, max=body.max, wait_seconds=body.wait_seconds)
    except Refused as exc:
        raise ApiError(401, exc.code, exc.detail) from None
    CLAIMED.inc(len(messages))
    if messages:
        note(queueId=",".join(str(m.queue_id) for m in messages[:5]), claimed=len(messages))
    return reply({"messages": [m.wire() for m in messages]})
