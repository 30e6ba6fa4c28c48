"""`claim` (POST /claim): the poll route.

This is the fallback transport AND the reconnect sweep: a first-class route, not the sad path. It
is fully correct with Realtime disabled and SUPABASE_JWT_SECRET unset, because the delivery
guarantee lives in the queue table, not in a socket; push only tells a machine to come here sooner.

A plain poll is one statement: who is calling, that it was seen, and the claim (an idle fleet's
every poll is this, so it is kept to one round trip). With `waitSeconds` it long-polls
(shared.dispatch.Dispatch.claim): the machine is known first, so its wake-ups are listened for
before the table is looked at.
"""

from __future__ import annotations

import flask

from functions.fleet_bodies import ClaimBody
from functions.telemetry import count
from functions.web import ApiError, Call, bearer, note, reply, require_orchestrator, routine
from shared.dispatch import Refused, hash_token


def claim(call: Call) -> flask.Response:
    try:
        body = call.body(ClaimBody, empty_ok=True)
    except ApiError:
        require_orchestrator(call.request, call.rt)  # a wrong token hears 401 before its body is judged
        raise
    try:
        if body.wait_seconds > 0:
            orch = require_orchestrator(call.request, call.rt)
            token_hash = hash_token(bearer(call.request) or "")
            messages = call.service.claim(
                orch.id, max=body.max, wait_seconds=body.wait_seconds, token_hash=token_hash
            )
        else:
            orch, messages = call.service.poll(bearer(call.request) or "", max=body.max)
            note(orchestratorId=orch.id)
    except Refused as exc:
        raise ApiError(401, exc.code, exc.detail) from None
    count("claimed", len(messages))
    if messages:
        note(queueId=",".join(str(m.queue_id) for m in messages[:5]), claimed=len(messages))
    elif not call.rt.settings.log_empty_polls:
        routine()  # (last_seen_at and /metrics still show the machine polling)
    return reply({"messages": [m.wire() for m in messages]})
