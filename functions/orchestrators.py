"""`orchestrators` target (admin bearer): register (POST), list (GET), revoke (POST /{id}/revoke).

The token is shown once, in the 201 answer, and stored only hashed.
"""

from __future__ import annotations

from uuid import UUID

import flask
import functions_framework

from functions.bodies import RegisterBody
from functions.runtime import Runtime
from functions.web import ApiError, handler, json_body, note, reply, require_admin
from shared import orchestrators as registry


def _subpath(request: flask.Request) -> list[str]:
    # Cloud Run serves this target at its own root; `devpilot serve` under /orchestrators.
    parts = [p for p in request.path.split("/") if p]
    if parts and parts[0] == "orchestrators":
        parts = parts[1:]
    return parts


@functions_framework.http
@handler("orchestrators")
def orchestrators(request: flask.Request, rt: Runtime) -> flask.Response:
    parts = _subpath(request)
    if len(parts) == 2 and parts[1] == "revoke":
        if request.method != "POST":
            raise ApiError(405, "method_not_allowed", "use POST", {"Allow": "POST"})
        require_admin(request, rt)
        try:
            oid = UUID(parts[0])
        except ValueError:
            raise ApiError(404, "not_found", "no such orchestrator") from None
        if not registry.revoke(rt.pool, oid):
            raise ApiError(404, "not_found", "no such orchestrator")
        note(orchestratorId=oid)
        return reply({"orchestratorId": str(oid), "status": "revoked"})
    if parts:
        raise ApiError(404, "not_found", "no such route")
    if request.method == "POST":
        require_admin(request, rt)
        body = json_body(request, RegisterBody)
        reg = registry.register(
            rt.pool, org_id=body.org_id, linear_user_id=body.linear_user_id, name=body.name
        )
        note(orchestratorId=reg.id)
        return reply({"orchestratorId": str(reg.id), "token": reg.token}, 201)
    if request.method == "GET":
        require_admin(request, rt)
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
                    }
                    for o in registry.list_all(rt.pool)
                ]
            }
        )
    raise ApiError(405, "method_not_allowed", "use GET or POST", {"Allow": "GET, POST"})
