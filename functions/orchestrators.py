"""`orchestrators` (admin): register (POST), list (GET), revoke (POST /{id}/revoke).

The token is shown once, in the 201 answer, and stored only hashed.
"""

from __future__ import annotations

from uuid import UUID

import flask

from functions.bodies import RegisterBody
from functions.web import ApiError, Call, note, reply
from shared.dispatch import orchestrators as registry


def register(call: Call) -> flask.Response:
    from shared.dispatch import is_member  # (the one Linear read; loads httpx with this route only)

    body = call.body(RegisterBody)
    # A typo guard, not a boundary (the admin is trusted): a user Linear says is not in the
    # connected workspace is refused; when Linear cannot be asked, registered as before, unverified.
    member = is_member(call.rt.pool, call.rt.settings, body.org_id, body.linear_user_id)
    if member is False:
        raise ApiError(
            400,
            "unknown_user",
            f"Linear has no user {body.linear_user_id!r} in workspace {body.org_id!r}; "
            "people can register their own machines with `devpilot-orchestrator login`",
        )
    reg = registry.register(
        call.rt.pool, org_id=body.org_id, linear_user_id=body.linear_user_id, name=body.name
    )
    note(orchestratorId=reg.id)
    answer: dict[str, object] = {
        "orchestratorId": str(reg.id),
        "token": reg.token,
        "verified": member is True,
    }
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
