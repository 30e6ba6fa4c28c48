"""The HTML of a session's page and of the search: server-rendered, no script, every value escaped.

The page is the link Linear shows beside the agent session (`externalUrls`): the issue, the
machine, the conversation's messages in order beside what was posted to Linear, the operators'
actions on it, and (for operators) the buttons that act, each a POST form with the CSRF token.
"""

from __future__ import annotations

from datetime import datetime
from html import escape
from typing import Any
from uuid import UUID

from functions.access import Viewer
from functions.dashboard import page
from shared.dispatch import ACTIVITY_TYPE, Page


def _t(value: datetime | None) -> str:
    if value is None:
        return '<span class="muted">—</span>'
    return (
        f'<time datetime="{escape(value.isoformat())}">{escape(value.strftime("%Y-%m-%d %H:%M:%S"))}</time>'
    )


def _attempts(message: dict[str, Any], failed: list[dict[str, Any]]) -> str:
    lines = [
        f'<li class="attempt failed">attempt {a["attempt"]} claimed {_t(a["claimed_at"])}, ended {_t(a["ended_at"])}: '
        f'<span class="bad">{escape(a["error"] or "no reason")}</span></li>'
        for a in failed
    ]
    if message["live_attempts"] is not None and message["live_claimed_at"] is not None:
        lines.append(
            f'<li class="attempt live">attempt {message["live_attempts"]} claimed {_t(message["live_claimed_at"])}'
            + (", lease held" if message["lease_expires_at"] is not None else "")
            + "</li>"
        )
    if message["delivered_at"] is not None:
        lines.append(f'<li class="attempt acked">acked {_t(message["delivered_at"])}</li>')
    return f"<ul>{''.join(lines)}</ul>" if lines else '<span class="muted">not claimed yet</span>'


def _post_state(p: dict[str, Any], paced_until: datetime | None) -> str:
    if p["sent_at"] is not None:
        return f'<span class="ok">sent {_t(p["sent_at"])}</span>'
    if p["superseded_by"] is not None:  # an ephemeral activity the agent's next post replaced
        return '<span class="muted superseded">not sent: replaced by the next activity before it went</span>'
    if p["given_up"]:
        return f'<span class="bad gave-up">given up after {p["attempts"]} attempt(s): {escape(p["last_error"] or "")}</span>'
    if paced_until is not None:
        return f'<span class="bad paced">waiting for Linear\'s rate limit until {_t(paced_until)}</span>'
    if p["last_error"]:
        return (
            f'<span class="bad retrying">failed {p["attempts"]} time(s), retrying {_t(p["next_at"])}: '
            f"{escape(p['last_error'])}</span>"
        )
    return "queued"


def _linear_missing(s: dict[str, Any]) -> str:
    """Why nothing reaches Linear for this session's workspace, with where to put it right (HTML);
    empty when the workspace is connected."""
    where = 'a workspace admin connects it at <a href="/oauth/install">/oauth/install</a>'
    if not s["linear_known"]:
        return f"Linear is not connected for this workspace, so nothing is posted there: {where}"
    if s["linear_disconnected_at"] is not None:
        why = escape(s["linear_disconnect_reason"] or "")
        return f"Linear is disconnected for this workspace ({why}): its posts wait until {where} again"
    return ""


def _post_type(p: dict[str, Any]) -> str:
    content = p["content"] or {}
    if p["kind"] == "activity" or "type" in content:
        return str(content.get("type") or ACTIVITY_TYPE.get(p["kind"], p["kind"]))
    return str(ACTIVITY_TYPE.get(p["kind"], p["kind"]))


def _post_body(p: dict[str, Any]) -> str:
    """What the post says, as Linear shows it: an action's tool, parameter and result; the plan's
    steps; an elicitation's options (the person's answer comes as a follow-up, and the agent says
    what it did with it); an ephemeral post marked so (Linear replaces it with the next)."""
    content = p["content"] or {}
    if content.get("type") == "action":
        result = content.get("result")
        shown = (
            f'<span class="tool">{escape(str(content.get("action") or ""))}</span> '
            f'<code class="parameter">{escape(str(content.get("parameter") or ""))}</code>'
            + (f'<pre class="result">{escape(str(result))}</pre>' if result is not None else "")
        )
    elif isinstance(content.get("plan"), list):
        shown = (
            '<ol class="plan">'
            + "".join(
                f'<li class="{escape(str(step.get("status")))}">{escape(str(step.get("content")))} '
                f'<span class="muted">({escape(str(step.get("status")))})</span></li>'
                for step in content["plan"]
                if isinstance(step, dict)
            )
            + "</ol>"
        )
    else:
        shown = escape(p["body"] or "")
    options = (p.get("signal_metadata") or {}).get("options") if p.get("signal") == "select" else None
    if isinstance(options, list):
        shown += (
            '<ul class="options">'
            + "".join(
                f"<li>{escape(str(o.get('label') or o.get('value')))}</li>"
                for o in options
                if isinstance(o, dict)
            )
            + "</ul>"
        )
    if p.get("ephemeral"):
        shown += ' <span class="muted ephemeral">(ephemeral)</span>'
    return shown


def _buttons(data: Page, who: Viewer) -> str:
    s = data.session
    sid = escape(str(s["id"]))
    csrf = f'<input type="hidden" name="csrf" value="{escape(who.csrf or "")}">'
    forms = []
    if s["status"] == "failed" and s["dead_payload"] is not None:
        forms.append(
            f'<form method="post" action="/sessions/{sid}/retry">{csrf}'
            f'<button type="submit" id="retry">Retry</button></form>'
        )
    if s["status"] == "queued":
        forms.append(
            f'<form method="post" action="/sessions/{sid}/cancel">{csrf}'
            f'<button type="submit" id="cancel">Cancel</button></form>'
        )
    if s["status"] == "queued" and s["kind"] == "start" and s["lease_expires_at"] is None and data.machines:
        options = "".join(
            f'<option value="{escape(str(m["id"]))}">{escape(m["name"])}</option>' for m in data.machines
        )
        forms.append(
            f'<form method="post" action="/sessions/{sid}/move">{csrf}'
            f'<select name="orchestratorId" id="move-to">{options}</select> '
            f'<button type="submit" id="move">Move</button></form>'
        )
    if not forms:
        return (
            '<p class="muted" id="no-actions">Nothing to do: the session is ' + escape(s["status"]) + ".</p>"
        )
    return '<div class="actions">' + "".join(forms) + "</div>"


def render(data: Page, who: Viewer, message: str = "") -> str:
    s = data.session
    title = s["issue_identifier"] or str(s["id"])
    # The title travels in the message: known while it is queued or dead-lettered.
    named = ((s["live_payload"] or s["dead_payload"] or {}).get("issue") or {}).get("title") or ""
    revoked = " (revoked)" if s["machine_revoked_at"] else ""
    agent = escape(s["agent_session_id"] or "none (a plain assignment)")
    if s["agent_session_created"]:
        agent += " (opened by devpilot)"
    dead = (
        f'<tr><th>dead letter</th><td class="bad" id="dead-letter">{_t(s["dead_at"])} after {s["dead_attempts"]} '
        f"attempt(s): {escape(s['dead_reason'] or '')}</td></tr>"
        if s["dead_at"] is not None
        else ""
    )
    # How the machine was chosen (routing by repository), when it was not simply the most recent one.
    routing = (
        f'<tr><th>routing</th><td id="routing">{escape(s["routing_note"])}</td></tr>'
        if s["routing_note"]
        else ""
    )
    missing = _linear_missing(s)
    linear = f'<tr><th>Linear</th><td class="bad" id="linear">{missing}</td></tr>' if missing else ""
    # The workspace's posts wait for Linear's rate limit (shared/linear/pace.py): none is lost or given up.
    pace = (
        f'<tr><th>Linear</th><td class="bad" id="linear-pace">waiting for Linear\'s rate limit until '
        f"{_t(s['paced_until'])} ({escape(s['ratelimit_budget'] or 'budget')} spent): this workspace's "
        "posts go, in order, after it</td></tr>"
        if s["paced_until"] is not None
        else ""
    )
    info = f"""<table id="session">
<tr><th>issue</th><td id="issue">{escape(s["issue_identifier"] or "")} {escape(named)} <span class="muted">{escape(s["issue_id"] or "")}</span></td></tr>
<tr><th>workspace</th><td id="workspace">{escape(s["workspace_name"] or s["org_id"])}</td></tr>
<tr><th>machine</th><td id="machine">{escape(s["machine"])}{revoked}</td></tr>
{routing}<tr><th>agent session</th><td id="agent-session">{agent}</td></tr>
<tr><th>status</th><td id="status">{escape(s["status"])}{(": " + escape(s["failure_reason"])) if s["failure_reason"] else ""}</td></tr>
{linear}{dead}{pace}</table>"""
    rows = "".join(
        f'<tr data-session="{escape(str(m["id"]))}"><td>{i}</td>'
        f'<td><a href="/sessions/{escape(str(m["id"]))}">{escape(m["kind"])}</a></td>'
        f'<td class="status">{escape(m["status"])}</td><td>{escape(m["machine"])}</td><td>{_t(m["created_at"])}</td>'
        f'<td class="attempts">{_attempts(m, data.attempts.get(m["id"], []))}</td>'
        f'<td class="dead">{("dead letter " + _t(m["dead_at"]) + ": " + escape(m["dead_reason"] or "")) if m["dead_at"] else ""}</td></tr>'
        for i, m in enumerate(data.messages, 1)
    )
    posts = (
        "".join(
            f'<tr data-post="{escape(str(p["id"]))}"><td class="type">{escape(_post_type(p))}</td>'
            f'<td class="from">{"agent" if p["by_agent"] else "devpilot"}</td>'
            f'<td class="body">{_post_body(p)}</td><td>{_t(p["created_at"])}</td>'
            f'<td class="state">{_post_state(p, s["paced_until"])}</td></tr>'
            for p in data.posts
        )
        or f'<tr><td colspan="5" class="muted" id="no-posts">{missing or "nothing posted to Linear"}</td></tr>'
    )
    actions = (
        "".join(
            f"<tr><td>{_t(a['at'])}</td><td>{escape(a['actor'])}</td><td>{escape(a['action'])}</td>"
            f"<td>{escape(a['detail'])}</td></tr>"
            for a in data.actions
        )
        or '<tr><td colspan="4" class="muted">none</td></tr>'
    )
    note = f'<p class="bad" id="message">{escape(message)}</p>' if message else ""
    buttons = _buttons(data, who) if who.operator else ""
    return page(
        f"devpilot — {title}",
        f"""<p><a href="/dashboard">dashboard</a> · <a href="/sessions">sessions</a></p>
<h1>{escape(title)}</h1>{note}{info}{buttons}
<div class="columns"><div><h2>Conversation</h2><table id="messages"><tr><th>#</th><th>kind</th><th>status</th>
<th>machine</th><th>queued</th><th>claims</th><th>dead letter</th></tr>{rows}</table></div>
<div><h2>Posted to Linear</h2><table id="posts"><tr><th>type</th><th>from</th><th>body</th><th>queued</th>
<th>Linear</th></tr>{posts}</table></div></div>
<h2>Operators' actions</h2><table id="actions"><tr><th>when</th><th>who</th><th>what</th><th>detail</th></tr>{actions}</table>""",
    )


def render_search(q: str, found: list[dict[str, Any]]) -> str:
    rows = (
        "".join(
            f'<tr><td><a href="/sessions/{escape(str(r["id"]))}">{escape(r["issue_identifier"] or str(r["id"]))}</a></td>'
            f"<td>{escape(r['kind'])}</td><td>{escape(r['status'])}</td><td>{escape(r['machine'])}</td>"
            f"<td>{escape(r['agent_session_id'] or '')}</td><td>{_t(r['created_at'])}</td></tr>"
            for r in found
        )
        or '<tr><td colspan="6" class="muted">no session found</td></tr>'
    )
    return page(
        "devpilot — sessions",
        f"""<p><a href="/dashboard">dashboard</a></p><h1>Sessions</h1>
<form method="get" action="/sessions"><input name="q" id="q" value="{escape(q)}"
placeholder="ENG-123, agent session id or machine"> <button type="submit" id="find">Find</button></form>
<table id="found"><tr><th>issue</th><th>kind</th><th>status</th><th>machine</th><th>agent session</th>
<th>queued</th></tr>{rows}</table>""",
    )


def not_found_page() -> str:
    return page(
        "devpilot — not found",
        "<h1>Not found</h1><p>No such session, or not one you may see. Operators sign in at "
        '<a href="/dashboard/login">/dashboard/login</a>.</p>',
    )


def session_url(session_id: UUID) -> str:
    return f"/sessions/{session_id}"
