"""Who is looking at a session page, and what they may do: one place that decides it.

`viewer(call)` asks each sign-in in `SIGN_INS`, in order, and takes the first that knows the
caller: the operators' (the admin bearer, or the dashboard's session cookie), who see every session
and may act on it; then a person signed in with Linear (the `/me` session), a member of one
workspace, who sees that workspace's sessions only and acts on none. `may_see` is the rule every
page and search applies; anyone it refuses gets 404, the same answer as a session that does not
exist.

A form post must carry the viewer's `csrf` token (derived from the secret of its cookie session,
which a page of another site cannot read); a bearer caller has no ambient credential and needs none.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from functions.dashboard import COOKIE, session_valid
from functions.web import ApiError, Call, bearer


@dataclass(frozen=True)
class Viewer:
    who: str  # recorded as the actor of an action
    operator: bool  # sees every session, and may retry, cancel and move
    org_id: str | None = None  # a workspace member: that workspace's sessions only
    csrf: str | None = None  # what a form post must carry (None: a bearer caller)


def csrf_for(secret: str) -> str:
    return hmac.new(secret.encode(), b"devpilot-csrf", hashlib.sha256).hexdigest()


def operator(call: Call) -> Viewer | None:
    """The admin bearer (a wrong one is the JSON 401 every admin route gives), or a live
    dashboard session."""
    token = call.rt.settings.admin_token
    given = bearer(call.request)
    if given is not None:
        if not token or not hmac.compare_digest(given.encode(), token.encode()):
            raise ApiError(401, "unauthorized", "missing or wrong admin bearer token")
        return Viewer("admin bearer", operator=True)
    cookie = call.request.cookies.get(COOKIE, "")
    if token and cookie and session_valid(call.rt, cookie):
        digest = hashlib.sha256(cookie.encode()).hexdigest()[:8]
        return Viewer(f"dashboard session {digest}", operator=True, csrf=csrf_for(cookie))
    return None


def person(call: Call) -> Viewer | None:
    """A person signed in with Linear (`/me`'s session cookie): their workspace's sessions."""
    from functions.pages import ME_COOKIE
    from shared.dispatch import people

    session = call.request.cookies.get(ME_COOKIE, "")
    who = people.signed_in(call.rt.pool, session) if session else None
    if who is None:
        return None
    return Viewer(f"{who.name} (Linear)", operator=False, org_id=who.org_id, csrf=people.csrf_token(session))


SIGN_INS: list[Callable[[Call], Viewer | None]] = [operator, person]


def viewer(call: Call) -> Viewer | None:
    for sign_in in SIGN_INS:
        found = sign_in(call)
        if found is not None:
            return found
    return None


def may_see(who: Viewer | None, org_id: str) -> bool:
    return who is not None and (who.operator or who.org_id == org_id)


def csrf_ok(who: Viewer, given: str | None) -> bool:
    if who.csrf is None:
        return True
    return given is not None and hmac.compare_digest(given.encode(), who.csrf.encode())
