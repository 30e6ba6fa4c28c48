"""`orchestrators` (admin): register (POST), list (GET), revoke (POST /{id}/revoke).

The token is shown once, in the 201 answer, and stored only hashed.
"""

from __future__ import annotations

from uuid import UUID

import flask

from functions.bodies import RegisterBody
from functions.web import ApiError, Call, note, reply
from shared import orchestrators as registry


def register(call: Call) -> flask.Response:
    body = call.body(RegisterBody)
    reg = registry.register(
        call.rt.pool, org_id=body.org_id, linear_user_id=body.linear_user_id, name=body.name
    )
    note(orchestratorId=reg.id)
    answer: dict[str, object] = {"orchestratorId": str(reg.id), "token": reg.token}
    if call.rt.settings.endpoints:
        answer["endpoints"] = call.rt.settings.endpoints
    return reply(answer, 201)


def list_orchestrators(call: Call) -> flask.Response:
    return reply(
        {
            "orchestrators": [
                {
                    "orchestratorId": str(o.id),
                    "orgId": o.org_id,
                    "linearUserId": o.linear_user_id,
                    "name": o.name,
                    "createdAt": o.created_at.isoformat(),
                    "lastSeenAt": o.last_seen_at.isoformat() if o.last_seen_at else None,
                    "revokedAt": o.revoked_at.isoformat() if o.revoked_at else None,
                    "active": o.revoked_at is None,
                    "repositories": list(o.repositories),
                    "labels": list(o.labels),
                }
                for o in registry.list_all(call.rt.pool)
            ]
        }
    )


def revoke(call: Call) -> flask.Response:
    oid: UUID = call.args["orchestrator_id"]
    revoked = call.service.revoke(oid)
    if revoked is None:
        raise ApiError(404, "not_found", "no such orchestrator")
    note(orchestratorId=oid, moved=revoked.moved, cancelled=revoked.cancelled)
    return reply(
        {
            "orchestratorId": str(oid),
            "status": "revoked",
            "moved": revoked.moved,
            "cancelled": revoked.cancelled,
        }
    )
