"""`devpilot-orchestrator login | logout | whoami | machines`: a person connects this machine by
signing in with Linear, and looks after it. A client of the HTTP contract (`/enroll`, `/me`), as the
rest of the orchestrator is.

`login` makes a PKCE verifier (RFC 7636; only its S256 challenge leaves the machine) and either
- listens on 127.0.0.1, on a port the system picks, for the one redirect back (RFC 8252), prints the
  service's link (first line: `Open this link to sign in: <URL>`) and opens it in a browser; the
  redirect brings a one-time code, redeemed with the verifier for the machine's token, or why the
  sign-in was refused (`error`, `error_description`: printed, exit 1); or
- (`--no-browser`, a machine without one) prints the page's address and a short code to type there,
  and asks every few seconds whether the person has signed in and confirmed.
The token goes to `login.json` in the state directory (mode 0600, the directory 0700), never to a
URL, the screen or the process list; later runs take it (and the URL) from there unless `--token`,
DEVPILOT_ORCHESTRATOR_TOKEN or `--url` say otherwise.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import hashlib
import os
import secrets
import socket
import sys
import threading
import time
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from orchestrator.repositories import told
from orchestrator.state import TOKEN_ENV, default_state_dir, forget, store, stored

LOGIN_DESCRIPTION = (
    "Register this machine for you: open the printed link, sign in with Linear, and the service gives "
    "this machine a token of its own, kept in the state directory (mode 0600), where every later "
    "devpilot-orchestrator run finds it with the URL. Logging in again with the same --name replaces "
    "that machine's token. A refused sign-in ends it with the reason, exit 1."
)


class Failed(Exception):
    """The command cannot go on: the reason is printed and the exit status is 1."""


def _ended(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.ArgumentParser, argparse.Namespace], int]:
    """The command, run with the state directory's default: a refusal (`Failed`), or Ctrl-C, is
    said in one line and the exit status is 1."""

    @functools.wraps(command)
    def run(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
        args.state_dir = args.state_dir or default_state_dir()
        try:
            return command(args)
        except Failed as exc:
            print(f"{p.prog}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"{p.prog}: interrupted", file=sys.stderr)
            return 1

    return run


# --- PKCE ------------------------------------------------------------------------------------------
def pkce() -> tuple[str, str]:
    """A verifier (64 characters of RFC 7636's alphabet) and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


# --- talking to the service ------------------------------------------------------------------------
def _reason(r: httpx.Response) -> str:
    try:
        body = r.json()
        return f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        return f"HTTP {r.status_code}"


def _send(http: httpx.Client, method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response:
    try:
        return http.request(method, url, json=body)
    except httpx.HTTPError as exc:
        raise Failed(f"the service at {url} could not be reached: {type(exc).__name__}") from None


def _post(http: httpx.Client, url: str, body: dict[str, Any]) -> httpx.Response:
    return _send(http, "POST", url, body)


def _registered(base: str, answer: dict[str, Any], state_dir: Path) -> str:
    saved = {
        "url": base,
        "token": answer["token"],
        "orchestratorId": answer["orchestratorId"],
        "name": answer.get("name"),
        "orgId": answer.get("orgId"),
        "workspaceName": answer.get("workspaceName"),
        "linearUserId": answer.get("linearUserId"),
        "personName": answer.get("personName"),
    }
    if isinstance(answer.get("endpoints"), dict):
        saved["endpoints"] = answer["endpoints"]
    path = store(state_dir, saved)
    print(f"The machine's token is in {path} (readable by you only).", file=sys.stderr)
    return (
        f"Registered {answer.get('name')} for {answer.get('personName') or answer.get('linearUserId')} "
        f"in {answer.get('workspaceName') or answer.get('orgId')}"
    )


# --- login, with a browser: the loopback redirect --------------------------------------------------
@dataclass
class Redirected:
    """What the one redirect back brought, and what the browser is then told."""

    outcome: str = ""  # the "Registered ..." line, once redeemed
    failure: str = ""


class Loopback(HTTPServer):
    """127.0.0.1 only, a port the system picks, for the one `GET /callback?code&state` that belongs
    to this enrollment (its state is the enrollment's id); anything else is 404 or 400, and waited past."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.expected_state = ""
        self.redeem: Any = None  # (code) -> the "Registered" line; raises Failed
        self.result = Redirected()
        self.done = threading.Event()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    server: Loopback

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path != "/callback":
            return self._answer(404, "Not here", "This address only takes devpilot's sign-in redirect.")
        if self.server.done.is_set() or not secrets.compare_digest(
            q.get("state", "").encode(), self.server.expected_state.encode()
        ):
            return self._answer(
                400, "Not this sign-in", "This is not the sign-in this terminal is waiting for."
            )
        self.server.done.set()  # one redirect only, whatever it brings
        if q.get("error"):  # the sign-in was refused (RFC 6749 §4.1.2.1): why, here and in the terminal
            why = q.get("error_description") or q["error"]
            self.server.result.failure = why
            return self._answer(403, "Not registered", f"{why}. Run login again once that is settled.")
        try:
            line = self.server.redeem(q.get("code", ""))
            self.server.result.outcome = line
            self._answer(200, "Signed in", f"{line}. You can close this tab and go back to the terminal.")
        except Failed as exc:
            self.server.result.failure = str(exc)
            self._answer(400, "Not registered", f"{exc}")

    def _answer(self, status: int, title: str, text: str) -> None:
        page = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title></head>'
            f'<body style="font:15px system-ui,sans-serif;margin:40px"><h1>{escape(title)}</h1>'
            f"<p>{escape(text)}</p></body></html>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header(
            "Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"
        )
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, format: str, *args: Any) -> None:  # (the URL holds the code: not logged)
        pass


def _with_browser(http: httpx.Client, base: str, name: str, state_dir: Path) -> str:
    verifier, challenge = pkce()
    server = Loopback()
    try:
        r = _post(
            http,
            f"{base}/enroll/sessions",
            {
                "name": name,
                "codeChallenge": challenge,
                "codeChallengeMethod": "S256",
                "loopbackPort": server.port,
            },
        )
        if r.status_code != 201:
            raise Failed(f"the service refused to start a sign-in: {_reason(r)}")
        started = r.json()
        server.expected_state = started["enrollId"]

        def redeem(code: str) -> str:
            body = {"enrollId": started["enrollId"], "codeVerifier": verifier, "code": code}
            answer = _post(http, f"{base}/enroll/token", body)
            if answer.status_code != 201:
                raise Failed(f"the service did not register this machine: {_reason(answer)}")
            return _registered(base, answer.json(), state_dir)

        server.redeem = redeem
        print(f"Open this link to sign in: {started['startUrl']}", flush=True)
        with contextlib.suppress(Exception):  # (no browser here: the link is printed)
            webbrowser.open(started["startUrl"])
        print(
            f"Waiting for the browser to come back to http://127.0.0.1:{server.port}/callback ...",
            file=sys.stderr,
        )
        server.timeout = 1.0
        deadline = time.monotonic() + float(started.get("expiresIn") or 600)
        while not server.done.is_set():
            if time.monotonic() > deadline:
                raise Failed("nobody signed in within 10 minutes; run login again")
            server.handle_request()
    finally:
        server.server_close()
    if server.result.failure:
        raise Failed(server.result.failure)
    return server.result.outcome


# --- login, without a browser: a code typed on the service's page ----------------------------------
def _with_code(http: httpx.Client, base: str, name: str, state_dir: Path) -> str:
    verifier, challenge = pkce()
    r = _post(
        http,
        f"{base}/enroll/sessions",
        {"name": name, "codeChallenge": challenge, "codeChallengeMethod": "S256", "mode": "code"},
    )
    if r.status_code != 201:
        raise Failed(f"the service refused to start a sign-in: {_reason(r)}")
    started = r.json()
    print(f"Open this page on any device: {started['verificationUrl']}", flush=True)
    print(f"and enter the code: {started['userCode']}", flush=True)
    print(
        "Waiting for you to sign in with Linear and confirm (the code expires in 10 minutes) ...",
        file=sys.stderr,
    )
    interval = max(1.0, float(started.get("interval") or 5))
    deadline = time.monotonic() + float(started.get("expiresIn") or 600) + interval
    body = {"enrollId": started["enrollId"], "codeVerifier": verifier}
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            answer = http.post(f"{base}/enroll/token", json=body)
        except httpx.HTTPError:
            continue  # (the service away for a moment: ask again)
        if answer.status_code == 201:
            return _registered(base, answer.json(), state_dir)
        code = answer.json().get("error") if answer.status_code == 400 else None
        if code == "authorization_pending" or answer.status_code >= 500:
            continue
        if code == "access_denied":  # Deny on the confirm page, or a sign-in the service refused
            raise Failed(str(answer.json().get("detail") or "the request was denied"))
        if code == "expired_token":
            raise Failed("the code expired before it was confirmed; run login again")
        raise Failed(f"the service did not register this machine: {_reason(answer)}")
    raise Failed("the code expired before it was confirmed; run login again")


# --- logout, whoami, machines: the machine's own token ---------------------------------------------
def _machine(args: argparse.Namespace) -> tuple[httpx.Client, str, dict[str, Any] | None]:
    saved = stored(args.state_dir)
    token = args.token or (saved or {}).get("token")
    base = (args.url or (saved or {}).get("url") or "").rstrip("/")
    if not token:
        raise Failed("this machine is not logged in: run `devpilot-orchestrator login --url BASE` first")
    if not base:  # a token given (--token, DEVPILOT_ORCHESTRATOR_TOKEN) without a login's URL
        raise Failed(
            "no service URL: give --url BASE (the service the token is for); "
            "`devpilot-orchestrator login --url BASE` keeps both"
        )
    http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"})
    return http, base, saved if saved and saved.get("token") == token else None


def _me(http: httpx.Client, base: str) -> dict[str, Any]:
    r = _send(http, "GET", f"{base}/me")
    if r.status_code != 200:
        raise Failed(f"the service refused this machine's token: {_reason(r)}")
    answer: dict[str, Any] = r.json()
    return answer


def _asked(args: argparse.Namespace) -> dict[str, Any]:
    http, base, _ = _machine(args)
    with http:
        return _me(http, base)


@_ended
def whoami(args: argparse.Namespace) -> int:
    me = _asked(args)
    print(f"workspace: {me.get('workspaceName') or me['orgId']} ({me['orgId']})")
    print(f"person: {me.get('personName') or me['linearUserId']} ({me['linearUserId']})")
    print(f"machine: {me['name']} ({me['orchestratorId']})")
    this: dict[str, Any] = next((m for m in me.get("orchestrators", []) if m.get("this")), {})
    if this.get("describedAt"):  # (as the orchestrator logged it when it started)
        at = datetime.fromisoformat(this["describedAt"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"told the service: {told(this.get('repositories') or [], this.get('labels') or [])} ({at})")
    else:
        print("told the service: nothing yet (the orchestrator tells it its --repo and --label as it starts)")
    return 0


def _has(m: dict[str, Any]) -> str:
    """What a machine said it has: repositories (`host/owner/name`, github.com left out), labels."""
    names = [
        r["fullName"] if r.get("hostname") in (None, "github.com") else f"{r['hostname']}/{r['fullName']}"
        for r in m.get("repositories") or []
    ]
    return ", ".join([*names, *(f"label {label}" for label in m.get("labels") or [])])


@_ended
def machines(args: argparse.Namespace) -> int:
    me = _asked(args)
    print(f"{'':2}{'machine':<24} {'last seen':<24} {'how':<10} {'queued':<16} has")
    for m in me["orchestrators"]:
        queued = f"{m['queued']}" + (f" ({', '.join(m['queuedIssues'])})" if m.get("queuedIssues") else "")
        mark = "* " if m.get("this") else "  "  # (this machine)
        seen = m.get("lastSeenAt")
        when = (
            datetime.fromisoformat(seen).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            if seen
            else "never"
        )
        print(f"{mark}{m['name']:<24} {when:<24} {m['transport']:<10} {queued:<16} {_has(m)}".rstrip())
    return 0


@_ended
def logout(args: argparse.Namespace) -> int:
    http, base, saved = _machine(args)
    with http:
        me = _me(http, base)
        r = _send(http, "POST", f"{base}/me/orchestrators/{me['orchestratorId']}/revoke")
    if r.status_code != 200:
        raise Failed(f"the service did not revoke this machine: {_reason(r)}")
    if saved is not None:
        forget(args.state_dir)
    moved, cancelled = r.json().get("moved", 0), r.json().get("cancelled", 0)
    print(
        f"Logged out: {me['name']} is revoked ({moved} queued moved to your other machine, {cancelled} cancelled)"
    )
    return 0


@_ended
def login(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    name = args.name or socket.gethostname()
    with httpx.Client(timeout=30) as http:
        line = (_with_code if args.no_browser else _with_browser)(http, base, name, args.state_dir)
    print(line, flush=True)
    return 0


# --- their arguments ------------------------------------------------------------------------------
def login_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the service's base URL")
    p.add_argument("--name", help="this machine's name (default: its host name)")
    p.add_argument(
        "--no-browser",
        action="store_true",
        help="print a page address and a code to type there from any device (over SSH), instead of "
        "opening a browser here",
    )
    _state_dir(p)


def machine_arguments(p: argparse.ArgumentParser) -> None:
    """`logout`, `whoami` and `machines`: the machine's own token, and the service it is for."""
    p.add_argument("--url", help="the service's base URL (default: the one logged in to)")
    p.add_argument("--token", default=os.environ.get(TOKEN_ENV), help=f"prefer {TOKEN_ENV}; default: login's")
    _state_dir(p)


def _state_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir", type=Path, default=None, help=f"state directory (default {default_state_dir()})"
    )
