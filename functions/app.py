"""Requests to views, through the one route table: routing (Werkzeug's), authorisation, JSON
errors for everything that goes wrong, and one structured log line per request.

- `serve_request(request)` routes by path across every route: the `api` target, and `wsgi` (the
  plain WSGI application `devpilot serve` runs).
- `target(name)` is one route as its own function: the functions-framework target and the Lambda
  handler of that name. It answers at its own URL's root and under its path.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Iterable
from functools import cache
from typing import TYPE_CHECKING

import flask
import psycopg
import psycopg_pool
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.routing import Map, MapAdapter, Rule

from functions.logs import Fields
from functions.routes import BY_NAME, ROUTES, Auth, Endpoint, Route
from functions.runtime import Runtime, get_runtime
from functions.telemetry import observe_route
from functions.web import (
    ApiError,
    Call,
    View,
    bearer,
    error,
    is_routine,
    notes,
    require_admin,
    require_agent,
    require_orchestrator,
    start_notes,
)
from shared.dispatch import UNAUTHORIZED, Orchestrator, SettingsError, crypto, deadline

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger("devpilot.request")
Handler = Callable[[flask.Request], flask.Response]
HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
# Nothing this service answers is meant to be framed (the dashboard least of all); a page that
# sets its own policy keeps it. Lowercase name, header, value.
FRAMING = (
    ("x-frame-options", "X-Frame-Options", "DENY"),
    ("content-security-policy", "Content-Security-Policy", "frame-ancestors 'none'"),
)


Endpoints = dict[str, tuple[Route, Endpoint]]


def _url_map(routes: Iterable[Route], *, at_root: bool) -> tuple[MapAdapter, Endpoints]:
    """The routes' rules, bound once: a request is matched by its path and method alone (no rule
    depends on the host or scheme), so nothing is bound per request."""
    rules: list[Rule] = []
    endpoints: Endpoints = {}
    for route in routes:
        for i, ep in enumerate(route.endpoints):
            key = f"{route.name}:{i}"
            endpoints[key] = (route, ep)
            paths = [route.path + ep.rule] + ([ep.rule or "/"] if at_root else [])
            rules += [Rule(p, endpoint=key, methods=list(ep.methods)) for p in paths]
    return Map(rules, strict_slashes=False, merge_slashes=False).bind(""), endpoints


@cache
def _view(route: Route, ep: Endpoint) -> View:
    """Imported on first use, so a target loads only its own module and what that needs."""
    view: View = getattr(importlib.import_module(route.module), ep.view)
    return view


def _authorise(auth: Auth, request: flask.Request, rt: Runtime) -> tuple[Orchestrator | None, str | None]:
    """Who is calling: the machine (and, for an agent COMMAND's token, the agent session it may use)."""
    if auth == "orchestrator":
        return require_orchestrator(request, rt), None
    if auth == "poll" and bearer(request) is None:  # (the view checks the token itself)
        raise ApiError(401, "unauthorized", UNAUTHORIZED)
    if auth == "agent":
        return require_agent(request, rt)
    if auth == "admin" or (auth == "scheduler" and not rt.settings.sweep_platform_auth):
        # (A scheduler-only service runs with DEVPILOT_SWEEP_PLATFORM_AUTH=1: the platform has
        # already verified the scheduler's identity before the request reaches us.)
        require_admin(request, rt)
    # "public": anyone; "dashboard": the view answers its login form to a caller without a session.
    return None, None


def _answer(routing: MapAdapter, endpoints: Endpoints, request: flask.Request) -> flask.Response:
    started = time.perf_counter()
    start_notes()
    name = "-"
    try:
        key, args = routing.match(request.path, request.method)
        route, ep = endpoints[key]
        name = route.name
        rt = get_runtime()
        # Every database block of the request shares one deadline (a long-poll extends it by its
        # wait; the sweep sets its own): past it, 503 db_unavailable below.
        with deadline.bound(rt.settings.request_deadline_seconds):
            caller, scope = _authorise(ep.auth, request, rt)
            resp = _view(route, ep)(Call(request, rt, args, caller, scope))
    except ApiError as exc:
        resp = error(exc.status, exc.code, exc.detail, exc.headers)
    except HTTPException as exc:  # no such path, or not this method
        headers = {}
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            headers["Allow"] = ", ".join(exc.valid_methods)
        code = exc.code or 400
        detail = f"no route {request.path}" if code == 404 else (exc.description or exc.name)
        resp = error(code, HTTP_ERROR_CODES.get(code, "bad_request"), detail, headers)
    except psycopg.DataError as exc:  # a value Postgres cannot store: the client's input
        resp = error(400, "bad_request", f"unstorable value: {type(exc).__name__}")
    except (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.errors.QueryCanceled) as exc:
        log.warning("database unavailable on %s: %s", name, type(exc).__name__)
        resp = error(503, "db_unavailable", "the database did not answer; retry", {"Retry-After": "2"})
    except SettingsError as exc:
        resp = error(503, "not_configured", str(exc))
    except crypto.NotConfigured as exc:
        resp = error(503, "encryption_not_configured", str(exc))
    except Exception:
        log.exception("unhandled error on %s", name)
        resp = error(500, "internal", "unexpected server error")
    # The names are scanned once: Werkzeug looks up a header that is absent by raising and
    # catching an HTTP exception, which `setdefault` did twice on every answer.
    present = {header.lower() for header, _ in resp.headers}
    for lower, header, value in FRAMING:
        if lower not in present:
            resp.headers.add(header, value)
    elapsed = time.perf_counter() - started
    observe_route(name, elapsed)
    level = logging.DEBUG if is_routine() else logging.INFO
    if log.isEnabledFor(level):
        line = {
            "route": name,
            "method": request.method,
            "status": resp.status_code,
            "ms": round(elapsed * 1000, 2),
        }
        log.log(level, "%s", Fields({**line, **notes()}))
    return resp


@cache
def _every_route() -> tuple[MapAdapter, Endpoints]:
    # Built on first use, not at import: a one-route target never compiles the other routes' rules.
    return _url_map(ROUTES, at_root=False)


def serve_request(request: flask.Request) -> flask.Response:
    """Every route, by path (`devpilot serve`, the `api` target)."""
    return _answer(*_every_route(), request)


@cache
def target(name: str) -> Handler:
    """One route as its own function (functions-framework target, Lambda handler)."""
    routing, endpoints = _url_map([BY_NAME[name]], at_root=True)

    def handle(request: flask.Request) -> flask.Response:
        return _answer(routing, endpoints, request)

    handle.__name__ = handle.__qualname__ = name
    return handle


def json_http_errors(app: flask.Flask) -> flask.Flask:
    """Errors raised by Flask/Werkzeug itself before a view runs (a malformed request, a path
    functions-framework keeps for itself) answer in the contract's JSON shape too, never HTML."""

    def as_json(exc: HTTPException) -> flask.Response:
        code = exc.code or 400
        return error(code, HTTP_ERROR_CODES.get(code, "bad_request"), exc.description or exc.name)

    app.register_error_handler(HTTPException, as_json)
    return app


def wsgi(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
    """Every route by path as a plain WSGI application: what `devpilot serve` runs.

    The same `serve_request` as the `api` target, without the Flask application around it: a
    Flask app pushes an app and a request context and matches its own URL rule on every request,
    which cost more server CPU than an empty claim's own work (bench/: server CPU per request).
    Views see the same `flask.Request`; nothing here reads Flask's per-request globals.
    """
    resp = serve_request(flask.Request(environ))
    chunks = resp(environ, start_response)
    if not resp.is_sequence:  # (nothing streams today; a stream would go out as it comes)
        return chunks
    # A body already in memory goes back as a list: Granian hands a list to its HTTP side in one
    # piece, where any other iterable costs a hand-off between threads per chunk and at its end.
    try:
        return list(chunks)
    finally:
        resp.close()  # (what the iterable's close would have run: the response's own close)
