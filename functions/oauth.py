"""`oauth` (public): connect a Linear workspace with OAuth (actor=app).

GET /oauth/install -> 302 to Linear's authorize page; GET /oauth/callback?code&state -> the code
exchanged, the tokens stored encrypted for the workspace (shared.linear.auth), a small page naming
it. A bad or expired state is 400 and nothing is sent to Linear; a refused exchange is 502 and
nothing is stored. Off (404 oauth_disabled) until LINEAR_CLIENT_ID, LINEAR_CLIENT_SECRET and
DEVPILOT_PUBLIC_URL are set.
"""

from __future__ import annotations

from html import escape

import flask

from functions.web import ApiError, Call, note
from shared.dispatch import linear_auth


def _enabled(call: Call) -> None:
    if not call.rt.settings.oauth_enabled:
        raise ApiError(
            404,
            "oauth_disabled",
            "set LINEAR_CLIENT_ID, LINEAR_CLIENT_SECRET and DEVPILOT_PUBLIC_URL to connect Linear",
        )


def _page(title: str, text: str, status: int) -> flask.Response:
    body = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title></head>'
        f'<body style="font:15px system-ui,sans-serif;margin:40px"><h1>{escape(title)}</h1><p>{escape(text)}</p></body></html>'
    )
    resp = flask.Response(body, status=status, mimetype="text/html")
    resp.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
    )
    resp.headers["Cache-Control"] = "no-store"
    return resp


def install(call: Call) -> flask.Response:
    _enabled(call)
    resp = flask.Response(status=302)
    resp.headers["Location"] = linear_auth.install_url(call.rt.settings)
    resp.headers["Cache-Control"] = "no-store"
    return resp


def callback(call: Call) -> flask.Response:
    _enabled(call)
    code, state = call.request.args.get("code"), call.request.args.get("state")
    if call.request.args.get("error"):
        return _page("Not connected", f"Linear said: {call.request.args.get('error')}", 400)
    if not code or not state:
        return _page(
            "Not connected", "The link is missing its code or state; start again from /oauth/install.", 400
        )
    try:
        installed = call.service.connect_linear(code, state)
    except linear_auth.BadState:
        return _page("Not connected", "This link is not ours, or older than 10 minutes; start again.", 400)
    except linear_auth.ExchangeRefused as exc:
        return _page("Not connected", f"Linear did not accept the connection: {exc}", 502)
    note(orgId=installed.org_id)
    return _page(
        "Connected", f"devpilot now posts to the Linear workspace {installed.name} as its agent.", 200
    )
