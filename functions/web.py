"""What every view shares: the call it is given, JSON errors, body limits, bearer auth."""

from __future__ import annotations

import hmac
import io
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

import flask

from functions.plain_body import BodyError, PlainBody
from functions.runtime import Runtime
from shared.dispatch import UNAUTHORIZED, Dispatch, Orchestrator, authenticate, authenticate_agent, jsoninput
from shared.wire import agent_tokens

MAX_BODY = 1024 * 1024  # 1 MiB

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")
P = TypeVar("P", bound=PlainBody)
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
    """The contract's error answer; its code goes on the request's log line too (a wrong secret and
    a stale timestamp are both 401s: the line tells them apart)."""
    note(error=code)
    return reply({"error": code, "detail": detail}, status, headers)


def start_notes() -> None:
    _ctx.fields = {}
    _ctx.routine = False


def routine() -> None:
    """This request's line is routine (an empty poll): logged at debug level, not info."""
    _ctx.routine = True


def is_routine() -> bool:
    return bool(getattr(_ctx, "routine", False))


def notes() -> dict[str, Any]:
    """The correlation ids noted for this request's log line."""
    fields: dict[str, Any] = getattr(_ctx, "fields", {})
    return fields


def note(**fields: Any) -> None:
    """Add correlation ids (sessionId, queueId, ...) to this request's log line."""
    extra: dict[str, Any] = getattr(_ctx, "fields", {})
    extra.update({k: str(v) for k, v in fields.items() if v is not None})
    _ctx.fields = extra


def raw_body(request: flask.Request) -> bytes:
    length = request.content_length
    if length is not None and length > MAX_BODY:
        raise ApiError(413, "too_large", f"body over {MAX_BODY} bytes")
    if length is not None:
        # The declared length, read from the server's own stream (without the wrapper Werkzeug's
        # `request.stream` builds on every request). A body that ends short is refused: one read
        # through that wrapper handed back the part that came as if it were the request.
        data: bytes = request.environ["wsgi.input"].read(length)
        if len(data) < length:
            raise ApiError(400, "bad_request", "the body ended before its Content-Length")
        # ...and stays readable through Werkzeug: functions-framework reads every request's body
        # again once the view has answered (on Cloud Run and Lambda).
        request.environ["wsgi.input"] = io.BytesIO(data)
        request.environ["wsgi.input_terminated"] = True
        return data
    data = request.stream.read(MAX_BODY + 1)  # no length (chunked): at most one byte over the cap
    if len(data) > MAX_BODY:
        raise ApiError(413, "too_large", f"body over {MAX_BODY} bytes")
    return data


def json_object(request: flask.Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object (an empty body is `{}` where `empty_ok`), or a 400."""
    data = raw_body(request)
    if not data.strip() and empty_ok:
        return {}
    try:
        parsed = jsoninput.load(data)
    except jsoninput.BadJson as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    if not isinstance(parsed, dict):
        raise ApiError(400, "bad_request", "body must be a JSON object")
    return parsed


@overload
def json_body(request: flask.Request, model: type[P], *, empty_ok: bool = False) -> P: ...
@overload
def json_body(request: flask.Request, model: type[M], *, empty_ok: bool = False) -> M: ...
def json_body(request: flask.Request, model: type[P] | type[M], *, empty_ok: bool = False) -> P | M:
    """The body read by its model: a fleet route's plain one (functions/fleet_bodies.py), or any
    other route's pydantic model; a body that breaks the model's rules is a 400 naming the field."""
    parsed = json_object(request, empty_ok=empty_ok)
    if issubclass(model, PlainBody):
        try:
            return model.parse(parsed)
        except BodyError as exc:
            raise ApiError(400, "bad_request", str(exc)) from None
    # Imported here: the fleet's targets never load pydantic (cold start, bench/README.md).
    from pydantic import ValidationError

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


def require_agent(request: flask.Request, rt: Runtime) -> tuple[Orchestrator, str | None]:
    """The machine's token, or an agent COMMAND's token scoped to one agent session."""
    token = bearer(request)
    if token is not None and token.startswith(f"{agent_tokens.PREFIX}."):
        found = authenticate_agent(rt.pool, token)
        if found is None:
            raise ApiError(401, "unauthorized", "missing, wrong, expired or revoked agent token")
        note(orchestratorId=found[0].id)
        return found
    return require_orchestrator(request, rt), None


def require_orchestrator(request: flask.Request, rt: Runtime, *, seen: bool = True) -> Orchestrator:
    """The calling machine, recorded as seen unless not `seen` (it is read about, not asking for work)."""
    token = bearer(request)
    orch = authenticate(rt.pool, token, seen=seen) if token else None
    if orch is None:
        raise ApiError(401, "unauthorized", UNAUTHORIZED)
    note(orchestratorId=orch.id)
    return orch


@dataclass(frozen=True)
class Call:
    """One request as a view sees it: already routed and authorised (functions/app.py)."""

    request: flask.Request
    rt: Runtime
    args: Mapping[str, Any] = field(default_factory=dict)  # path parameters of the matched rule
    caller: Orchestrator | None = None  # set on orchestrator (and agent) routes
    scope: str | None = None  # an agent COMMAND's token: the one agent session it may speak in

    @property
    def orch(self) -> Orchestrator:
        if self.caller is None:
            raise RuntimeError("this route is not an orchestrator route")
        return self.caller

    @property
    def service(self) -> Dispatch:
        return self.rt.service

    @overload
    def body(self, model: type[P], *, empty_ok: bool = False) -> P: ...
    @overload
    def body(self, model: type[M], *, empty_ok: bool = False) -> M: ...
    def body(self, model: type[P] | type[M], *, empty_ok: bool = False) -> P | M:
        return json_body(self.request, model, empty_ok=empty_ok)


View = Callable[[Call], flask.Response]
