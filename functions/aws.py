"""AWS Lambda entry points: one handler per row of the route table (`functions.aws.webhook`, ...),
and `functions.aws.api` for every route on one URL.

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

from functions.app import json_http_errors
from functions.routes import BY_NAME

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


def _is_http(event: dict[str, Any]) -> bool:
    return isinstance(event, dict) and "requestContext" in event and "http" in event.get("requestContext", {})


def _entry(target: str) -> LambdaHandler:
    def handle(event: dict[str, Any], context: Any) -> dict[str, Any]:
        if target == "sweep" and not _is_http(event):
            # A scheduled event (EventBridge), not HTTP: IAM allowed only the scheduler to invoke.
            from functions.sweep import run_sweep

            return run_sweep()
        return _handler_for(target)(event, context)

    handle.__name__ = target
    return handle


def __getattr__(name: str) -> LambdaHandler:
    if name in BY_NAME or name == "api":
        handler = _entry(name)
        globals()[name] = handler
        return handler
    raise AttributeError(name)
