"""`plan` (POST /plan): the agent's plan, shown in Linear's session view.

Called by the agent COMMAND (`devpilot-orchestrator plan`) with the token scoped to its own agent
session, or by the machine. The plan goes into the outbox in one transaction (202) and is posted
after commit as `agentSessionUpdate(plan)`, in order with the agent session's other plans. Who may
post, and the errors, as for /activities.
"""

from __future__ import annotations

import flask

from functions.activities import STATUS
from functions.bodies import PlanBody
from functions.web import ApiError, Call, note, reply
from shared.dispatch import Refused


def plan(call: Call) -> flask.Response:
    body = call.body(PlanBody)
    note(agentSessionId=body.agent_session_id)
    if call.scope is not None and call.scope != body.agent_session_id:
        raise ApiError(404, "not_found", "no agent session of yours by that id")
    steps = [s.model_dump() for s in body.plan]
    try:
        call.service.accept_plan(call.orch, body.agent_session_id, steps)
    except Refused as exc:
        raise ApiError(STATUS[exc.code], exc.code, exc.detail) from None
    return reply({"status": "queued"}, 202)
