"""`linear_credentials` target (admin bearer): an org's Linear app access token, for notices.

POST /linear-credentials {"orgId", "accessToken"} stores it encrypted; GET lists the orgs that have
one (never the token); DELETE /linear-credentials/{orgId} forgets it.
"""

from __future__ import annotations

import flask
import functions_framework
from pydantic import Field, StrictStr

from functions.bodies import Body
from functions.runtime import Runtime
from functions.web import ApiError, handler, json_body, note, reply, require_admin
from shared import notices


class CredentialsBody(Body):
    org_id: StrictStr = Field(alias="orgId", min_length=1, max_length=200)
    access_token: StrictStr = Field(alias="accessToken", min_length=1, max_length=4000)


@functions_framework.http
@handler("linear_credentials")
def linear_credentials(request: flask.Request, rt: Runtime) -> flask.Response:
    require_admin(request, rt)
    parts = [p for p in request.path.split("/") if p]
    if parts and parts[0] == "linear-credentials":
        parts = parts[1:]
    if request.method == "POST" and not parts:
        body = json_body(request, CredentialsBody)
        notices.store_credentials(rt.pool, rt.settings, body.org_id, body.access_token)
        note(orgId=body.org_id)
        return reply({"orgId": body.org_id, "stored": True})
    if request.method == "GET" and not parts:
        return reply(
            {
                "orgs": [
                    {"orgId": r["org_id"], "updatedAt": r["updated_at"].isoformat()}
                    for r in notices.list_credentials(rt.pool)
                ]
            }
        )
    if request.method == "DELETE" and len(parts) == 1:
        if not notices.delete_credentials(rt.pool, parts[0]):
            raise ApiError(404, "not_found", "no credentials for that org")
        return reply({"orgId": parts[0], "deleted": True})
    raise ApiError(
        405 if not parts else 404,
        "method_not_allowed" if not parts else "not_found",
        "use POST or GET /linear-credentials, DELETE /linear-credentials/{orgId}",
    )
