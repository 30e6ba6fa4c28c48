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
            signal=body.signal,
            signal_metadata=body.signal_metadata,
        )
    except Refused as exc:
        raise ApiError(STATUS[exc.code], exc.code, exc.detail) from None
    return reply({"activityId": str(aid), "status": "queued"}, 202)


def list_activities(call: Call) -> flask.Response:
    """GET /activities?agentSessionId=…: the agent session's activities in order, the service's
    and the agent's (what the machine writes into COMMAND's transcript)."""
    from shared.dispatch import ACTIVITY_TYPE as NOTICE_TYPE  # (the service's own notices' types)

    agent_session_id = call.request.args.get("agentSessionId", "")
    if not agent_session_id or len(agent_session_id) > 200:
        raise ApiError(400, "bad_request", "give agentSessionId")
    note(agentSessionId=agent_session_id)
    if call.scope is not None and call.scope != agent_session_id:
        raise ApiError(404, "not_found", "no agent session of yours by that id")
    try:
        rows = call.service.activities_of(call.orch, agent_session_id)
    except Refused as exc:
        raise ApiError(STATUS[exc.code], exc.code, exc.detail) from None
    return reply(
        {
            "activities": [
                {
                    "id": str(r["id"]),
                    "from": "agent" if r["by_agent"] else "service",
                    "type": (r["content"] or {}).get("type") or NOTICE_TYPE.get(r["kind"], r["kind"]),
                    "body": r["body"],
                    "content": r["content"],
                    "signal": r["signal"],
                    "signalMetadata": r["signal_metadata"],
                    "createdAt": r["created_at"].isoformat(),
                    "sentAt": r["sent_at"].isoformat() if r["sent_at"] else None,
                }
                for r in rows
            ]
        }
    )
