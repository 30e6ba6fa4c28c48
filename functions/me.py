"""`me`: a person's own machines.

Two ways in, never mixed: a person signed in with Linear (the `/me` session cookie, separate from
the operators' dashboard session; its forms carry a CSRF token), or one of their machines' bearer
token (`devpilot-orchestrator whoami | machines | logout`: JSON).

GET /me -> the page (or, with a machine's token, JSON: the machine, its person and their machines);
GET /me/signin -> Linear's authorize page; POST /me/orchestrators/{id}/revoke -> revoke one's own
machine (its work moves as an operator's revoke moves it; anyone else's is 404);
POST /me/logout -> the session ends on the server.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from urllib.parse import parse_qs
from uuid import UUID

import flask

from functions.pages import ME_COOKIE, drop, guarded, page, redirect, to_linear
from functions.web import ApiError, Call, bearer, note, raw_body, reply, require_orchestrator
from shared.dispatch import Orchestrator, enroll, people


def _machine(call: Call) -> Orchestrator | None:
    """The calling machine, when the request carries a bearer token (a wrong one is 401). Not
    recorded as seen: `whoami` and `machines` read; only the machine's own orchestrator asking for
    work makes it the one routing prefers."""
    if bearer(call.request) is None:
        return None
    return require_orchestrator(call.request, call.rt, seen=False)


def _when(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


@guarded
def me(call: Call) -> flask.Response:
    machine = _machine(call)
    if machine is not None:
        person = people.owner(call.rt.pool, machine)
        listed = [
            {
                "orchestratorId": str(m.id),
                "name": m.name,
                "createdAt": m.created_at.isoformat(),
                "lastSeenAt": _when(m.last_seen_at),
                "transport": m.transport,
                "queued": m.queued,
                "queuedIssues": m.issues,
                "repositories": m.repositories,
                "labels": m.labels,
                "describedAt": _when(m.described_at),
                "this": m.id == machine.id,
            }
            for m in people.machines(call.rt.pool, person)
        ]
        return reply(
            {
                "orchestratorId": str(machine.id),
                "name": machine.name,
                "orgId": person.org_id,
                "workspaceName": person.workspace_name,
                "linearUserId": person.linear_user_id,
                "personName": person.name,
                "orchestrators": listed,
            }
        )
    session = call.request.cookies.get(ME_COOKIE, "")
    signed_in = people.signed_in(call.rt.pool, session)
    if signed_in is None:
        return page(
            "Your machines",
            "<p>Sign in with Linear to see the machines that take your issues.</p>"
            '<p><a href="/me/signin" id="signin">Sign in with Linear</a></p>',
            401,
        )
    return _page(call, signed_in, session)


def _page(call: Call, person: people.Person, session: str, message: str = "") -> flask.Response:
    csrf = escape(people.csrf_token(session))
    rows = (
        "".join(
            f'<tr data-orchestrator="{escape(str(m.id))}"><td>{escape(m.name)}</td>'
            f"<td>{escape(m.last_seen_at.isoformat(timespec='seconds')) if m.last_seen_at else 'never'}</td>"
            f'<td class="transport">{escape(m.transport)}</td><td class="queued">{m.queued}'
            f"{' (' + escape(', '.join(m.issues)) + ')' if m.issues else ''}</td>"
            f'<td class="has">{escape(", ".join(m.has)) or "—"}</td>'
            f'<td><form method="post" action="/me/orchestrators/{escape(str(m.id))}/revoke">'
            f'<input type="hidden" name="csrf" value="{csrf}"><button type="submit">Revoke</button></form></td></tr>'
            for m in people.machines(call.rt.pool, person)
        )
        or '<tr><td colspan="6" class="muted">none yet: run <code>devpilot-orchestrator login</code></td></tr>'
    )
    said = f'<p class="bad">{escape(message)}</p>' if message else ""
    return page(
        "Your machines",
        f"""{said}<p>{escape(person.name or person.linear_user_id)} in
<b>{escape(person.workspace_name or person.org_id)}</b></p>
<table id="machines"><tr><th>machine</th><th>last seen</th><th>how</th><th>queued</th><th>has</th><th></th></tr>{rows}</table>
<form method="post" action="/me/logout"><input type="hidden" name="csrf" value="{csrf}">
<p><button type="submit">Sign out</button></p></form>""",
    )


@guarded
def signin(call: Call) -> flask.Response:
    if not call.rt.settings.signin_enabled:
        raise ApiError(404, "signin_disabled", "signing in with Linear is not configured on this server")
    started = enroll.start_me(call.rt.pool, call.rt.settings)
    return to_linear(started.location, started.browser_secret, enroll.FLOW_SECONDS)


def _form(call: Call) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(raw_body(call.request).decode("utf-8", "replace")).items()}


@guarded
def revoke(call: Call) -> flask.Response:
    oid: UUID = call.args["orchestrator_id"]
    machine = _machine(call)
    session = "" if machine is not None else call.request.cookies.get(ME_COOKIE, "")
    person = people.owner(call.rt.pool, machine) if machine else people.signed_in(call.rt.pool, session)
    if person is None:
        raise ApiError(401, "unauthorized", "sign in with Linear at /me, or use one of your machines' tokens")
    if machine is None and not people.csrf_ok(session, _form(call).get("csrf", "")):
        raise ApiError(403, "bad_csrf", "this form is stale or not ours; reload /me and try again")
    if not people.owns(call.rt.pool, person, oid):
        raise ApiError(404, "not_found", "no machine of yours by that id")
    revoked = call.service.revoke(oid)
    assert revoked is not None
    note(orchestratorId=oid, moved=revoked.moved, cancelled=revoked.cancelled)
    if machine is None:
        return redirect("/me", 303)
    return reply(
        {
            "orchestratorId": str(oid),
            "status": "revoked",
            "moved": revoked.moved,
            "cancelled": revoked.cancelled,
        }
    )


@guarded
def logout(call: Call) -> flask.Response:
    session = call.request.cookies.get(ME_COOKIE, "")
    if session and people.csrf_ok(session, _form(call).get("csrf", "")):
        people.end_session(call.rt.pool, session)
    return drop(redirect("/me", 303), ME_COOKIE)
