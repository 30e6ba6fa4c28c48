"""`dashboard` target (GET /dashboard, admin): a small server-rendered page of the operators'
figures, refreshing itself, with an inline SVG chart of queue depth and delivery latency over
the last hour. No front-end build: one HTML response, no script.

Auth: the admin bearer token in `Authorization`, or the login form (POST /dashboard/login), which
starts a new random session per login (the Secure, HttpOnly, SameSite=Strict cookie holds it; the
database only its hash; at most 12 hours). POST /dashboard/logout ends it on the server. Repeated
wrong tokens from one client get 429 for a while. No dashboard answer may be framed.
"""

from __future__ import annotations

import hmac
from html import escape
from typing import Any
from urllib.parse import parse_qs, quote

import flask

from functions.runtime import Runtime
from functions.web import Call, bearer, raw_body, require_admin
from shared.dispatch import Snapshot, dashboard_signin, format_age, pace_text, snapshot

COOKIE = "devpilot_dashboard"
REFRESH_SECONDS = 10


def session_valid(rt: Runtime, cookie: str) -> bool:
    """A dashboard session that was started by a login and has not ended or expired."""
    return dashboard_signin.session_valid(rt.pool, cookie)


def _authorised(request: flask.Request, rt: Runtime) -> bool:
    token = rt.settings.admin_token
    if not token:
        return False
    given = bearer(request)
    if given is not None:
        return hmac.compare_digest(given.encode(), token.encode())
    cookie = request.cookies.get(COOKIE, "")
    return bool(cookie) and session_valid(rt, cookie)


def page(title: str, body: str, refresh: bool = False) -> str:
    """A whole HTML page in the operators' style (the dashboard, the session pages)."""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}
<title>{escape(title)}</title><style>
body{{font:14px system-ui,sans-serif;margin:24px;color:#1d1d1f}} h1{{font-size:20px}} h2{{font-size:15px;margin-top:24px}}
table{{border-collapse:collapse}} td,th{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}}
th{{background:#f4f4f6}} .num{{text-align:right}} .bad{{color:#b00020}} .muted{{color:#777}}
.cards span{{display:inline-block;margin-right:18px;padding:8px 12px;background:#f4f4f6;border-radius:6px}}
.ok{{color:#1a7f37}} .columns{{display:flex;gap:28px;align-items:flex-start;flex-wrap:wrap}} td ul{{margin:0;padding-left:16px}}
.actions form{{display:inline-block;margin:8px 12px 8px 0}} #session th{{width:120px}}
</style></head><body>{body}</body></html>"""


def login_page(message: str = "") -> str:
    note = f'<p class="bad">{escape(message)}</p>' if message else ""
    return page(
        "devpilot — sign in",
        f"""<h1>devpilot dispatch</h1>{note}
<form method="post" action="/dashboard/login"><label>Admin token
<input type="password" name="token" id="token" autocomplete="current-password"></label>
<button type="submit" id="signin">Sign in</button></form>""",
    )


def _chart(history: list[dict[str, Any]]) -> str:
    w, h, pad = 680, 180, 44
    n = max(1, len(history) - 1)
    depth = [float(x["depth"] or 0) for x in history]
    lat = [float(x["latency_s"]) if x["latency_s"] is not None else None for x in history]
    dmax = max([*depth, 1.0])
    lmax = max([v for v in lat if v is not None] + [1.0])

    def pts(vals: list[float | None], vmax: float) -> str:
        return " ".join(
            f"{pad + i * (w - 2 * pad) / n:.1f},{h - pad - (v / vmax) * (h - 2 * pad):.1f}"
            for i, v in enumerate(vals)
            if v is not None
        )

    # The scale: three gridlines, queue depth read on the left axis, latency on the right.
    grid = "".join(
        f'<line class="grid" x1="{pad}" x2="{w - pad}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e3e3e8"/>'
        f'<text class="axis-depth" x="{pad - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#3366cc">{dmax * f:.0f}</text>'
        f'<text class="axis-latency" x="{w - pad + 6}" y="{y + 4:.1f}" fill="#dc7633">{lmax * f:.1f} s</text>'
        for f in (0.0, 0.5, 1.0)
        for y in [h - pad - f * (h - 2 * pad)]
    )
    minutes = "".join(
        f'<text class="axis-time" x="{pad + i * (w - 2 * pad) / 4:.1f}" y="{h - pad + 16}" text-anchor="middle" '
        f'fill="#777">{label}</text>'
        for i, label in enumerate(("−60 min", "−45", "−30", "−15", "now"))
    )
    return f"""<svg id="chart" width="{w}" height="{h}" role="img" aria-label="queue depth and delivery latency, last hour">
<rect x="0" y="0" width="{w}" height="{h}" fill="#fbfbfd" stroke="#ddd"/>{grid}{minutes}
<polyline fill="none" stroke="#3366cc" stroke-width="2" points="{pts(list(depth), dmax)}"/>
<polyline fill="none" stroke="#dc7633" stroke-width="2" points="{pts(lat, lmax)}"/>
<text x="{pad}" y="16" fill="#3366cc">queue depth (max {dmax:.0f})</text>
<text x="{w - 260}" y="16" fill="#dc7633">delivery latency (max {lmax:.1f} s)</text>
</svg>"""


def render(snap: Snapshot) -> str:
    t = snap.totals
    cards = "".join(
        f'<span id="total-{k}">{escape(k)}{"" if k == "queued" else " (24 h)"}: <b>{t.get(k, 0)}</b></span>'
        for k in ("queued", "delivered", "failed", "cancelled")
    )
    rows = "".join(
        f'<tr data-orchestrator="{escape(o.id)}"><td><a href="/sessions?q={quote(o.name)}">{escape(o.name)}</a></td>'
        f"<td>{escape(o.org_id)}</td>"
        f'<td>{escape(o.linear_user_id)}</td><td class="num queued">{o.queued}</td>'
        f'<td class="num claimed">{o.claimed}</td><td class="num">{format_age(o.oldest_due_s)}</td>'
        f'<td class="num">{o.attempts}</td>'
        f"<td>{escape(o.last_seen_at.isoformat(timespec='seconds')) if o.last_seen_at else 'never'}"
        f"{'' if o.active else ' (revoked)'}</td>"
        f'<td class="has">{escape(_has(o.repositories, o.labels))}</td></tr>'
        for o in snap.orchestrators
    )
    failed = (
        "".join(
            f'<tr><td><a href="/sessions/{escape(str(f["id"]))}">{escape(f["issue_identifier"] or str(f["id"]))}</a></td>'
            f'<td class="bad">{escape(f["failure_reason"] or "")}</td>'
            f"<td>{escape(f['updated_at'].isoformat(timespec='seconds'))}</td></tr>"
            for f in snap.failed
        )
        or '<tr><td colspan="3" class="muted">none</td></tr>'
    )
    linear = (
        "".join(
            f'<tr data-org="{escape(c["org_id"])}"><td>{escape(c["org_id"])}</td><td>{escape(c["workspace_name"] or "")}</td>'
            f"<td>{escape(c['kind'])}</td>"
            + (
                '<td class="connected">connected</td>'
                if c["disconnected_at"] is None
                else f'<td class="bad disconnected">disconnected: {escape(c["disconnect_reason"] or "")}</td>'
            )
            + f'<td class="{"bad paced" if c["paced_until"] else "pace"}">{escape(pace_text(c))}</td>'
            + "</tr>"
            for c in snap.linear
        )
        or '<tr><td colspan="5" class="muted">no workspace connected</td></tr>'
    )
    sw = snap.last_sweep
    sweep = (
        (
            f"last sweep {escape(sw['ran_at'].isoformat(timespec='seconds'))}: requeued {sw['requeued']}, "
            f"dead-lettered {sw['dead_lettered']}"
        )
        if sw
        else "the sweep has not run yet"
    )
    return page(
        "devpilot — dispatch",
        f"""<h1>devpilot dispatch</h1>
<p class="muted">as of {escape(snap.taken_at.isoformat(timespec="seconds"))}; refreshes every {REFRESH_SECONDS} s</p>
<div class="cards">{cards}</div>
<form method="get" action="/sessions"><input name="q" id="q" placeholder="ENG-123, agent session id or machine">
<button type="submit" id="find">Find sessions</button></form>
<h2>Orchestrators</h2><table id="orchestrators"><tr><th>machine</th><th>org</th><th>Linear user</th>
<th>queued</th><th>claimed</th><th>oldest due</th><th>attempts</th><th>last seen</th><th>has</th></tr>{rows}</table>
<h2>Last hour</h2>{_chart(snap.history)}
<h2>Linear</h2><table id="linear"><tr><th>org</th><th>workspace</th><th>kind</th><th>state</th><th>rate limit</th></tr>{linear}</table>
<h2>Recent failures</h2><table id="failed"><tr><th>issue</th><th>reason</th><th>when</th></tr>{failed}</table>
<p id="sweep">{sweep}</p>""",
        refresh=True,
    )


def _has(repositories: list[str], labels: list[str]) -> str:
    """What a machine said it has: its repositories, then its labels."""
    return ", ".join([*repositories, *(f"label {lb}" for lb in labels)])


def html(body: str, status: int = 200, headers: dict[str, str] | None = None) -> flask.Response:
    """An HTML answer as every operators' page sends it: never stored, no referrer, no script,
    forms only to this service, never framed."""
    resp = flask.Response(body, status=status, mimetype="text/html")
    resp.headers["Cache-Control"] = "no-store"
    resp.headers["Referrer-Policy"] = "no-referrer"
    resp.headers["Content-Security-Policy"] = (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
    )
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def login_form(call: Call) -> flask.Response:
    return html(login_page())


def login(call: Call) -> flask.Response:
    client = call.request.remote_addr or "unknown"
    if dashboard_signin.login_blocked(call.rt.pool, client):
        return html(
            login_page("too many wrong tokens; try again later"),
            429,
            {"Retry-After": str(dashboard_signin.LOGIN_WINDOW_SECONDS)},
        )
    form = parse_qs(raw_body(call.request).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0]
    expected = call.rt.settings.admin_token
    if not expected or not hmac.compare_digest(token.encode(), expected.encode()):
        dashboard_signin.login_failed(call.rt.pool, client)
        return html(login_page("wrong token"), 401)
    session = dashboard_signin.start_session(call.rt.pool, client)
    resp = html("", 303, {"Location": "/dashboard"})
    resp.set_cookie(
        COOKIE,
        session,
        secure=True,
        httponly=True,
        samesite="Strict",
        path="/",  # the dashboard and the session pages
        max_age=dashboard_signin.SESSION_SECONDS,
    )
    return resp


def logout(call: Call) -> flask.Response:
    cookie = call.request.cookies.get(COOKIE, "")
    if cookie:
        dashboard_signin.end_session(call.rt.pool, cookie)
    resp = html("", 303, {"Location": "/dashboard/login"})
    resp.delete_cookie(COOKIE, path="/")
    return resp


def dashboard(call: Call) -> flask.Response:
    if not _authorised(call.request, call.rt):
        if bearer(call.request) is not None:
            require_admin(call.request, call.rt)  # a wrong bearer gets the JSON 401 like every route
        return html(login_page(), 401)
    return html(render(snapshot(call.rt.pool)))
