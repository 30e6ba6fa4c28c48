"""`linear_credentials` (admin): an org's static Linear token, for posting to Linear.

POST /linear-credentials {"orgId", "accessToken"} stores it encrypted (a personal API key, or a
token obtained elsewhere; never refreshed — `/oauth/install` connects a workspace properly); GET
lists the orgs that have a connection and its state (never a token); DELETE /linear-credentials/{orgId}
forgets it.
"""

from __future__ import annotations

import flask

from functions.bodies import CredentialsBody
from functions.web import ApiError, Call, note, reply
from shared.dispatch import linear_auth


def store(call: Call) -> flask.Response:
    body = call.body(CredentialsBody)
    linear_auth.store_static(call.rt.pool, call.rt.settings, body.org_id, body.access_token)
    note(orgId=body.org_id)
    answer: dict[str, object] = {"orgId": body.org_id, "stored": True}
    if linear_auth.is_personal_key(body.access_token):
        answer["credential"] = "personal_api_key"
        answer["warning"] = PERSONAL_KEY_WARNING
    else:
        answer["credential"] = "access_token"
    return reply(answer)


PERSONAL_KEY_WARNING = (
    "A personal API key acts as the person who made it, not as the app: Linear refuses agent "
    "activities posted with it, so agent sessions hear nothing. Connect the workspace with "
    "/oauth/install for the agent to speak as itself."
)


def list_credentials(call: Call) -> flask.Response:
    return reply(
        {
            "orgs": [
                {
                    "orgId": r["org_id"],
                    "kind": r["kind"],
                    "workspace": r["workspace_name"],
                    "expiresAt": r["expires_at"].isoformat() if r["expires_at"] else None,
                    "connected": r["disconnected_at"] is None,
                    "disconnectReason": r["disconnect_reason"],
                    "updatedAt": r["updated_at"].isoformat(),
                }
                for r in linear_auth.list_credentials(call.rt.pool)
            ]
        }
    )


def forget(call: Call) -> flask.Response:
    org_id: str = call.args["org_id"]
    if not linear_auth.delete_credentials(call.rt.pool, org_id):
        raise ApiError(404, "not_found", "no credentials for that org")
    return reply({"orgId": org_id, "deleted": True})
