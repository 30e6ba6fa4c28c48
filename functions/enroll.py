"""`enroll` (public): people connect their own machines by signing in with Linear (shared.fleet.enroll).

POST /enroll/sessions (the machine asks; rate-limited per client) -> the start link, or a code;
GET /enroll/start?enroll=ID -> Linear's authorize page (a loopback enrollment's link);
GET /enroll, POST /enroll -> the page where a code is typed, then Linear's authorize page;
GET /enroll/callback -> who signed in; the loopback redirect, or the confirm page (code mode);
POST /enroll/confirm -> Register or Deny (code mode; the page's CSRF token, the same browser);
POST /enroll/token -> the machine's token, once.
Off (404 signin_disabled) until a sign-in client (LINEAR_SIGNIN_CLIENT_ID/SECRET, or the agent
app's LINEAR_CLIENT_ID/SECRET) and DEVPILOT_PUBLIC_URL are set; /enroll/token always answers.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape
from urllib.parse import parse_qs

import flask

from functions.bodies import EnrollBody, EnrollTokenBody, loose_uuid
from functions.pages import (
    ME_COOKIE,
    SIGNIN_COOKIE,
    drop,
    guarded,
    keep,
    origin,
    page,
    private,
    redirect,
    text_page,
    to_linear,
)
from functions.web import ApiError, Call, note, raw_body, reply
from shared.dispatch import SignInFailed, enroll, people


def _enabled(call: Call) -> str:
    """The service's public base URL, once sign-in is configured."""
    if not call.rt.settings.signin_enabled:
        raise ApiError(
            404,
            "signin_disabled",
            "set DEVPILOT_PUBLIC_URL and a sign-in client (LINEAR_SIGNIN_CLIENT_ID/SECRET, or "
            "LINEAR_CLIENT_ID/SECRET) to let people connect machines",
        )
    return (call.rt.settings.public_url or "").rstrip("/")


def _client(call: Call) -> str:
    return call.request.remote_addr or "unknown"


def _limited(exc: enroll.Limited) -> ApiError:
    return ApiError(429, "too_many_attempts", str(exc), {"Retry-After": str(exc.retry_after)})


@guarded
def create(call: Call) -> flask.Response:
    base = _enabled(call)
    body = call.body(EnrollBody)
    try:
        created = enroll.create(
            call.rt.pool,
            name=body.name.strip(),
            challenge=body.code_challenge,
            port=body.loopback_port if body.mode == "loopback" else None,
            client=_client(call),
        )
    except enroll.Limited as exc:
        raise _limited(exc) from None
    note(enrollId=created.id)
    answer: dict[str, object] = {"enrollId": str(created.id), "expiresIn": enroll.ENROLL_SECONDS}
    if created.user_code is None:
        answer["startUrl"] = f"{base}/enroll/start?enroll={created.id}"
    else:
        answer |= {
            "userCode": enroll.show_code(created.user_code),
            "verificationUrl": f"{base}/enroll",
            "interval": enroll.POLL_SECONDS,
        }
    return reply(answer, 201)


@guarded
def start(call: Call) -> flask.Response:
    _enabled(call)
    try:
        started = enroll.start_loopback(
            call.rt.pool, call.rt.settings, loose_uuid(call.request.args.get("enroll", ""))
        )
    except enroll.Gone as exc:
        return text_page("Sign-in link expired", f"{exc}. Run `devpilot-orchestrator login` again.", 400)
    return to_linear(started.location, started.browser_secret, enroll.ENROLL_SECONDS)


def _code_form(call: Call, message: str = "", status: int = 200) -> flask.Response:
    note_html = f'<p class="bad">{escape(message)}</p>' if message else ""
    return page(
        "Connect a machine",
        f"""{note_html}<p>Type the code your machine shows (<code>devpilot-orchestrator login --no-browser</code>).
You will sign in with Linear, then confirm the machine.</p>
<form method="post" action="/enroll"><input name="code" autocomplete="off" autocapitalize="characters"
spellcheck="false" placeholder="XXXX-XXXX" maxlength="20" autofocus> <button type="submit">Continue</button></form>""",
        status,
        form_to=origin(call.rt.settings.linear_oauth_authorize_url),
    )


@guarded
def code_form(call: Call) -> flask.Response:
    _enabled(call)
    return _code_form(call)


@guarded
def enter_code(call: Call) -> flask.Response:
    _enabled(call)
    form = parse_qs(raw_body(call.request).decode("utf-8", "replace"))
    try:
        started = enroll.enter_code(
            call.rt.pool, call.rt.settings, (form.get("code") or [""])[0][:100], _client(call)
        )
    except enroll.Limited as exc:
        resp = _code_form(call, "Too many wrong codes from here; try again later.", 429)
        resp.headers["Retry-After"] = str(exc.retry_after)
        return resp
    except enroll.WrongCode as exc:
        return _code_form(call, f"{str(exc).capitalize()}.", 400)
    return to_linear(started.location, started.browser_secret, enroll.ENROLL_SECONDS, 303)


@guarded
def callback(call: Call) -> flask.Response:
    base = _enabled(call)
    args = call.request.args
    again = (f"{base}/enroll", "Start again")
    if args.get("error"):
        # Linear's words, escaped like everything else on the page (never markup of theirs)
        said = args.get("error", "")[:200] + (
            f": {args.get('error_description', '')[:500]}" if args.get("error_description") else ""
        )
        cookie = call.request.cookies.get(SIGNIN_COOKIE, "")
        told = enroll.refused_by_linear(call.rt.pool, args.get("state", ""), cookie, said)
        if told is not None:  # a loopback login: it hears why, and its page says it
            note(refused="linear")
            return drop(redirect(told, 302), SIGNIN_COOKIE)
        return text_page("Not signed in", f"Linear did not sign you in: {said}", 400)
    code, state = args.get("code"), args.get("state")
    if not code or not state:
        return text_page("Not signed in", "The link is missing its code or state; start again.", 400)
    browser = call.request.cookies.get(SIGNIN_COOKIE, "")
    try:
        signed = enroll.callback(call.rt.pool, call.rt.settings, code, state, browser)
    except enroll.BadState as exc:
        why = (
            "This sign-in was started in another browser (or another sign-in started since in this one): "
            "finish it there, or start again here."
            if exc.other_browser
            else "This sign-in link is not ours, was already used, or is older than 10 minutes; start again."
        )
        return text_page("Not signed in", why, 400)
    except SignInFailed as exc:
        return text_page("Not signed in", f"{exc}.", 502)
    except enroll.NotAllowed as exc:
        if exc.loopback is not None:  # the waiting login hears why at once, and its page says it
            note(refused=exc.code)
            return drop(redirect(exc.loopback, 302), SIGNIN_COOKIE)
        return text_page("Not allowed", f"{exc.detail}.", 403, code=exc.code)
    except enroll.Gone as exc:
        return text_page("Not signed in", f"{str(exc).capitalize()}.", 400, link=again)
    note(orgId=signed.viewer.org_id)
    if signed.session is not None:  # a /me sign-in
        resp = keep(redirect("/me", 303), ME_COOKIE, signed.session, people.SESSION_SECONDS)
    elif signed.loopback is not None:
        resp = redirect(signed.loopback, 302)
    else:
        assert signed.confirm is not None
        return _confirm_page(signed)  # (keeps the sign-in cookie: the confirm form needs it)
    return drop(resp, SIGNIN_COOKIE)


def _confirm_page(signed: enroll.SignedIn) -> flask.Response:
    c, v = signed.confirm, signed.viewer
    assert c is not None
    when = c.requested_at.astimezone(UTC)
    minutes = max(0, int((datetime.now(UTC) - when).total_seconds() // 60))
    ago = "less than a minute ago" if minutes == 0 else f"{minutes} minute{'s' if minutes > 1 else ''} ago"
    return page(
        "Connect this machine?",
        f"""<p>Register the machine <b id="machine">{escape(c.machine)}</b> for <b id="person">{escape(v.name)}</b>
in the Linear workspace <b id="workspace">{escape(v.workspace)}</b>? The issues assigned to you there will run on it.</p>
<p class="muted">The request came from <b id="address">{escape(c.requested_from)}</b> at
<b id="when">{escape(when.strftime("%Y-%m-%d %H:%M:%S UTC"))}</b> ({escape(ago)}).
Register it only if you started it yourself, just now.</p>
<form method="post" action="/enroll/confirm"><input type="hidden" name="enroll" value="{escape(str(c.enrollment_id))}">
<input type="hidden" name="csrf" value="{escape(c.csrf)}">
<button type="submit" name="decision" value="register" id="register">Register</button>
<button type="submit" name="decision" value="deny" id="deny">Deny</button></form>""",
    )


@guarded
def confirm(call: Call) -> flask.Response:
    _enabled(call)
    form = {k: v[0] for k, v in parse_qs(raw_body(call.request).decode("utf-8", "replace")).items()}
    decision = form.get("decision")
    if decision not in ("register", "deny"):
        return text_page("Not confirmed", "Choose Register or Deny.", 400)
    try:
        name = enroll.decide(
            call.rt.pool,
            loose_uuid(form.get("enroll", "")),
            call.request.cookies.get(SIGNIN_COOKIE, ""),
            form.get("csrf", ""),
            approve=decision == "register",
        )
    except enroll.Gone as exc:
        return text_page("Not confirmed", f"{str(exc).capitalize()}.", 400)
    if decision == "register":
        resp = text_page("Machine registered", f"{name} is registered; its terminal finishes on its own.")
    else:
        resp = text_page("Request denied", f"{name} was not registered.")
    return drop(resp, SIGNIN_COOKIE)


@guarded
def token(call: Call) -> flask.Response:
    body = call.body(EnrollTokenBody)
    try:
        redeemed = enroll.redeem(call.rt.pool, loose_uuid(body.enroll_id), body.code_verifier, body.code)
    except enroll.TokenError as exc:
        raise ApiError(400, exc.code, exc.detail) from None
    note(orchestratorId=redeemed.orchestrator_id)
    who = people.person(call.rt.pool, redeemed.org_id, redeemed.linear_user_id)
    answer: dict[str, object] = {
        "orchestratorId": str(redeemed.orchestrator_id),
        "token": redeemed.token,
        "orgId": redeemed.org_id,
        "linearUserId": redeemed.linear_user_id,
        "workspaceName": who.workspace_name or redeemed.org_id,
        "personName": who.name or redeemed.linear_user_id,
        "name": redeemed.name,
        "replaced": redeemed.replaced,
    }
    if call.rt.settings.endpoints:
        answer["endpoints"] = call.rt.settings.endpoints
    return private(reply(answer, 201))
