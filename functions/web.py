"""What every handler shares: JSON errors, body limits, bearer auth, one log line per request."""

from __future__ import annotations

import functools
import hmac
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import flask
import psycopg
import psycopg_pool
from pydantic import BaseModel, ValidationError
from werkzeug.exceptions import HTTPException

from functions.runtime import Runtime, get_runtime
from functions.telemetry import ROUTE_HISTOGRAMS
from shared.linear import has_nul
from shared.orchestrators import Orchestrator, authenticate
from shared.settings import SettingsError

MAX_BODY = 1024 * 1024  # 1 MiB

log = logging.getLogger("devpilot.request")
Handler = Callable[[flask.Request], flask.Response]
M = TypeVar("M", bound=BaseModel)
_ctx = threading.local()


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers or {}


def reply(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> flask.Response:
    resp = flask.Response(json.dumps(body, separators=(",", ":")), status=status, mimetype="application/json")
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def error(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> flask.Response:
    return reply({"error": code, "detail": detail}, status, headers)


def note(**fields: Any) -> None:
    """Add correlation ids (sessionId, queueId, ...) to this request's log line."""
    extra: dict[str, Any] = getattr(_ctx, "fields", {})
    extra.update({k: str(v) for k, v in fields.items() if v is not None})
    _ctx.fields = extra


def raw_body(request: flask.Request) -> bytes:
    length = request.content_length
    if length is not None and length > MAX_BODY:
        raise ApiError(413, "too_large", f"body over {MAX_BODY} bytes")
    data = request.stream.read(MAX_BODY + 1)
    if len(data) > MAX_BODY:
        raise ApiError(413, "too_large", f"body over {MAX_BODY} bytes")
    return data


def json_body(request: flask.Request, model: type[M], *, empty_ok: bool = False) -> M:
    data = raw_body(request)
    if not data.strip() and empty_ok:
        return model()
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ApiError(400, "bad_request", "body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise ApiError(400, "bad_request", "body must be a JSON object")
    if has_nul(parsed):
        raise ApiError(400, "bad_request", "strings must not contain NUL (U+0000)")
    try:
        return model.model_validate(parsed)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(400, "bad_request", f"{where}: {first['msg']}") from None


def bearer(request: flask.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require_admin(request: flask.Request, rt: Runtime) -> None:
    expected = rt.settings.admin_token
    given = bearer(request)
    if not expected:
        raise ApiError(401, "unauthorized", "DEVPILOT_ADMIN_TOKEN is not configured on this server")
    if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "unauthorized", "missing or wrong admin bearer token")


def require_orchestrator(request: flask.Request, rt: Runtime) -> Orchestrator:
    token = bearer(request)
    orch = authenticate(rt.pool, token) if token else None
    if orch is None:
        raise ApiError(401, "unauthorized", "missing, wrong or revoked orchestrator token")
    note(orchestratorId=orch.id)
    return orch


def require_method(request: flask.Request, *methods: str) -> None:
    if request.method not in methods:
        raise ApiError(
            405, "method_not_allowed", f"use {' or '.join(methods)}", {"Allow": ", ".join(methods)}
        )


def handler(route: str) -> Callable[[Callable[[flask.Request, Runtime], flask.Response]], Handler]:
    """Wrap a route: contract errors as JSON, the database's absence as 503, one log line."""

    def wrap(fn: Callable[[flask.Request, Runtime], flask.Response]) -> Handler:
        @functools.wraps(fn)
        def run(request: flask.Request) -> flask.Response:
            started = time.perf_counter()
            _ctx.fields = {}
            try:
                resp = fn(request, get_runtime())
            except ApiError as exc:
                resp = error(exc.status, exc.code, exc.detail, exc.headers)
            except psycopg.DataError as exc:  # a value Postgres cannot store: the client's input
                resp = error(400, "bad_request", f"unstorable value: {type(exc).__name__}")
            except (psycopg.OperationalError, psycopg_pool.PoolTimeout, psycopg.errors.QueryCanceled) as exc:
                log.warning("database unavailable on %s: %s", route, type(exc).__name__)
                resp = error(
                    503, "db_unavailable", "the database did not answer; retry", {"Retry-After": "2"}
                )
            except SettingsError as exc:
                resp = error(503, "not_configured", str(exc))
            except Exception:
                log.exception("unhandled error on %s", route)
                resp = error(500, "internal", "unexpected server error")
            elapsed = time.perf_counter() - started
            if route in ROUTE_HISTOGRAMS:
                ROUTE_HISTOGRAMS[route].observe(elapsed)
            fields = getattr(_ctx, "fields", {})
            log.info(
                json.dumps(
                    {
                        "route": route,
                        "method": request.method,
                        "status": resp.status_code,
                        "ms": round(elapsed * 1000, 2),
                        **fields,
                    },
                    separators=(",", ":"),
                )
            )
            return resp

        return run

    return wrap


def json_http_errors(app: flask.Flask) -> flask.Flask:
    """Errors raised by Flask/Werkzeug itself (a path no rule matches, a malformed request) answer in
    the contract's JSON shape too, never an HTML page."""

    def as_json(exc: HTTPException) -> flask.Response:
        code = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}.get(
            exc.code or 400, "bad_request"
        )
        return error(exc.code or 400, code, exc.description or exc.name)

    app.register_error_handler(HTTPException, as_json)
    return app


class StructuredFormatter(logging.Formatter):
    """Every line structured: JSON objects when not on a terminal (request lines are already JSON;
    other records are wrapped), `key=value` text on a terminal."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        try:
            fields = json.loads(msg) if msg.startswith("{") else None
        except json.JSONDecodeError:
            fields = None
        if not isinstance(fields, dict):
            fields = {"msg": msg}
        fields = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            **fields,
        }
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.as_json:
            return json.dumps(fields, separators=(",", ":"), default=str)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        rest = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("ts", "level", "logger", "msg"))
        return f"{stamp} {fields['level']:<7} {fields.get('msg', '')} {rest}".rstrip()


def setup_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger("devpilot")
    if not root.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(StructuredFormatter(as_json=not sys.stderr.isatty()))
        root.addHandler(h)
        root.setLevel(level)
        root.propagate = False
