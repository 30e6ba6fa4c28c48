"""`activities` (POST /activities): the agent talks back to Linear.

Called by the machine, or by the agent COMMAND with the token scoped to its own agent session. The
activity goes into the outbox table in one transaction (202) and is posted to Linear after commit,
in acceptance order per agent session, with its id as Linear's idempotency id.
"""

from __future__ import annotations

import flask

from functions.bodies import ActivityBody
from functions.web import ApiError, Call, note, reply
from shared.dispatch import Refused

STATUS = {"not_found": 404, "linear_not_connected": 409}


def activities(call: Call) -> flask.Response:
    body = call.body(ActivityBody)
    note(agentSessionId=body.agent_session_id)
    if call.scope is not None and call.scope != body.agent_session_id:
        raise ApiError(404, "not_found", "no agent session of yours by that id")
    try:
        aid = call.service.accept_activity(
            call.orch,
            body.agent_session_id,
            body.content.linear(),
            activity_id=body.id,
            ephemeral=body.ephemeral,
        )
    except Refused as exc:
        raise ApiError(STATUS[exc.code], exc.code, exc.detail) from None
    return reply({"activityId": str(aid), "status": "queued"}, 202)
