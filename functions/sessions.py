"""`sessions` target: a page per session, the search that finds one, and operators' actions.

- GET /sessions?q=TEXT: sessions by issue identifier, agent session id or machine name.
- GET /sessions/<id>: the session's page (functions/session_page.py).
- POST /sessions/<id>/retry | cancel | move: an operator's action. With the admin bearer (the API,
  scripts): a JSON answer, `409 not_allowed` when the session's state does not allow it. From the
  page (the dashboard's session cookie): a form with the CSRF token; back to the page after it.

Who sees what is decided in one place (`functions/access.py`); anyone else gets 404.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

import flask

from functions import access, session_page
from functions.bodies import MoveBody, loose_uuid
from functions.dashboard import html
from functions.web import ApiError, Call, bearer, note, raw_body, reply
from shared.dispatch import sessions


def _not_found(call: Call) -> flask.Response:
    if bearer(call.request) is not None:
        raise ApiError(404, "not_found", "no such session")
    return html(session_page.not_found_page(), 404)


def search(call: Call) -> flask.Response:
    who = access.viewer(call)
    if who is None:
        return _not_found(call)
    q = call.request.args.get("q", "")[:200]
    found = [r for r in sessions.search(call.rt.pool, q) if access.may_see(who, r["org_id"])]
    return html(session_page.render_search(q, found))


def show(call: Call) -> flask.Response:
    who = access.viewer(call)
    data = sessions.read(call.rt.pool, call.args["session_id"])
    if data is None or not access.may_see(who, data.session["org_id"]):
        return _not_found(call)
    assert who is not None
    return html(session_page.render(data, who))


def retry(call: Call) -> flask.Response:
    return _act(call, "retry")


def cancel(call: Call) -> flask.Response:
    return _act(call, "cancel")


def move(call: Call) -> flask.Response:
    return _act(call, "move")


def _act(call: Call, action: str) -> flask.Response:
    """An operator's action. A form (the page) carries the CSRF token and is sent back to the page;
    a bearer call gets JSON."""
    who = access.viewer(call)
    session_id: UUID = call.args["session_id"]
    note(sessionId=session_id)
    if who is None or not who.operator:
        return _not_found(call)
    form: dict[str, Any] = {}
    target: UUID | None = None
    if who.csrf is not None:  # a browser's form post
        form = {k: v[0] for k, v in parse_qs(raw_body(call.request).decode("utf-8", "replace")).items()}
        if not access.csrf_ok(who, form.get("csrf")):
            raise ApiError(403, "csrf", "the form's CSRF token is missing or wrong; reload the page")
        if action == "move":
            target = loose_uuid(str(form.get("orchestratorId", "")))
    elif action == "move":
        target = loose_uuid(call.body(MoveBody).orchestrator_id)
    try:
        acted = call.service.act_on_session(session_id, action, who.who, target)
    except sessions.NotFound:
        return _not_found(call)
    except sessions.NotAllowed as exc:
        if who.csrf is None:
            raise ApiError(409, "not_allowed", str(exc)) from None
        data = sessions.read(call.rt.pool, session_id)
        assert data is not None
        return html(session_page.render(data, who, f"{action}: {exc}"), 409)
    if who.csrf is None:
        return reply({"status": acted.status, "sessionId": str(session_id), "detail": acted.detail})
    return html("", 303, {"Location": session_page.session_url(session_id)})
