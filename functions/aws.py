"""AWS Lambda entry points: one handler per target (`functions.aws.webhook`, ...).

Each takes Lambda Function URL events (payload format 2.0) through apig-wsgi, a maintained
WSGI-on-Lambda adapter, over the same functions-framework app that Cloud Run serves; nothing in
the handlers is AWS-specific. `sweep` also accepts an EventBridge Scheduler (or rule) event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import functions_framework
from apig_wsgi import make_lambda_handler

from functions.sweep import run_sweep
from functions.web import json_http_errors

LambdaHandler = Callable[[dict[str, Any], Any], dict[str, Any]]
SOURCE = str(Path(__file__).with_name("main.py"))
_handlers: dict[str, LambdaHandler] = {}
_lock = threading.Lock()


def _handler_for(target: str) -> LambdaHandler:
    with _lock:
        if target not in _handlers:
            app = functions_framework.create_app(  # type: ignore[no-untyped-call]
                target=target, source=SOURCE, signature_type="http"
            )
            _handlers[target] = make_lambda_handler(json_http_errors(app), binary_support=True)
        return _handlers[target]


def _entry(target: str) -> LambdaHandler:
    def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        return _handler_for(target)(event, context)

    handle.__name__ = target
    return handle


def _is_http(event: dict[str, Any]) -> bool:
    return isinstance(event, dict) and "requestContext" in event and "http" in event.get("requestContext", {})


webhook = _entry("webhook")
claim = _entry("claim")
ack = _entry("ack")
release = _entry("release")
orchestrators = _entry("orchestrators")
realtime_token = _entry("realtime_token")
healthz = _entry("healthz")
_sweep_http = _entry("sweep")


def sweep(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """HTTP (admin bearer, via the Function URL) or a scheduled event (no HTTP, trusted by IAM)."""
    if _is_http(event):
        return _sweep_http(event, context)
    return run_sweep()


TARGETS = ("webhook", "claim", "ack", "release", "sweep", "orchestrators", "realtime_token", "healthz")
