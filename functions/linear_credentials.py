"""`linear_credentials` (admin): an org's Linear app access token, for notices.

POST /linear-credentials {"orgId", "accessToken"} stores it encrypted; GET lists the orgs that have
one (never the token); DELETE /linear-credentials/{orgId} forgets it.
"""

from __future__ import annotations

import flask

from functions.bodies import CredentialsBody
from functions.web import ApiError, Call, note, reply
from shared import notices


def store(call: Call) -> flask.Response:
    body = call.body(CredentialsBody)
    notices.store_credentials(call.rt.pool, call.rt.settings, body.org_id, body.access_token)
    note(orgId=body.org_id)
    return reply({"orgId": body.org_id, "stored": True})


def list_credentials(call: Call) -> flask.Response:
    return reply(
        {
            "orgs": [
                {"orgId": r["org_id"], "updatedAt": r["updated_at"].isoformat()}
                for r in notices.list_credentials(call.rt.pool)
            ]
        }
    )


def forget(call: Call) -> flask.Response:
    org_id: str = call.args["org_id"]
    if not notices.delete_credentials(call.rt.pool, org_id):
        raise ApiError(404, "not_found", "no credentials for that org")
    return reply({"orgId": org_id, "deleted": True})
