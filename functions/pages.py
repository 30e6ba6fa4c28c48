"""What every answer of the people-facing routes (/enroll, /me) carries: never cached, never a
Referer (their URLs hold states and codes), never framed; and their small server-rendered pages.
No script on any page."""

from __future__ import annotations

import functools
from collections.abc import Callable
from html import escape
from urllib.parse import urlsplit

import flask

from functions.web import ApiError, Call, View, error, note

SIGNIN_COOKIE = "__Host-devpilot-signin"  # one browser's trip through Linear's sign-in
ME_COOKIE = "__Host-devpilot-me"  # a person's /me session


def private(resp: flask.Response, *, form_to: str = "") -> flask.Response:
    """The headers of every answer here. `form_to`: an origin a form of this page may lead to
    (the code page's form answers with a redirect to Linear, which form-action must allow)."""
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["Content-Security-Policy"] = (
        f"default-src 'none'; style-src 'unsafe-inline'; form-action 'self'{' ' + form_to if form_to else ''}; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    return resp


def guarded(view: Callable[[Call], flask.Response]) -> View:
    """A view whose every answer, errors included, carries `private`'s headers."""

    @functools.wraps(view)
    def run(call: Call) -> flask.Response:
        try:
            resp = view(call)
        except ApiError as exc:
            resp = error(exc.status, exc.code, exc.detail, exc.headers)
        return private(resp) if "Referrer-Policy" not in resp.headers else resp

    return run


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


STYLE = """body{font:15px system-ui,sans-serif;margin:40px auto;max-width:640px;color:#1d1d1f;padding:0 16px}
h1{font-size:22px} table{border-collapse:collapse;width:100%} td,th{padding:6px 8px;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f6} .muted{color:#666} .bad{color:#b00020} .code{font:600 26px ui-monospace,monospace;letter-spacing:2px}
button{font:inherit;padding:6px 14px;margin-right:8px} input[name=code]{font:600 22px ui-monospace,monospace;width:12ch;text-transform:uppercase}"""


def page(title: str, body: str, status: int = 200, *, form_to: str = "") -> flask.Response:
    """A page; `body` is HTML the caller built with every value escaped."""
    html = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
        f'content="width=device-width"><title>{escape(title)}</title><style>{STYLE}</style></head>'
        f"<body><h1>{escape(title)}</h1>{body}</body></html>"
    )
    return private(flask.Response(html, status=status, mimetype="text/html"), form_to=form_to)


def text_page(
    title: str, text: str, status: int = 200, *, code: str = "", link: tuple[str, str] | None = None
) -> flask.Response:
    """A page of one paragraph (escaped), an error code to quote (and to log), and a link to go on with."""
    extra = ""
    if code:
        note(error=code)
        extra = f'<p class="muted">({escape(code)})</p>'

    if link is not None:
        extra += f'<p><a href="{escape(link[0])}">{escape(link[1])}</a></p>'
    return page(title, f"<p>{escape(text)}</p>{extra}", status)


def redirect(location: str, status: int = 302) -> flask.Response:
    resp = flask.Response(status=status)
    resp.headers["Location"] = location
    return private(resp)


def keep(resp: flask.Response, cookie: str, value: str, seconds: int) -> flask.Response:
    """A cookie of these routes: `__Host-` (Secure, path /, no domain), HttpOnly, and Lax, so that it
    comes back on Linear's top-level redirect to the callback (Strict would not)."""
    resp.set_cookie(cookie, value, max_age=seconds, secure=True, httponly=True, samesite="Lax", path="/")
    return resp


def drop(resp: flask.Response, cookie: str) -> flask.Response:
    resp.delete_cookie(cookie, path="/", secure=True, httponly=True, samesite="Lax")
    return resp


def to_linear(location: str, browser_secret: str, seconds: int, status: int = 302) -> flask.Response:
    """Off to Linear's authorize page, with the cookie that ties the way back to this browser."""
    return keep(redirect(location, status), SIGNIN_COOKIE, browser_secret, seconds)
