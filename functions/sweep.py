"""`sweep` (POST /sweep, scheduler): re-queue expired leases, dead-letter at the limit, send the
Linear notices still unsent, forget webhook deliveries past their retention.

Also the scheduled entry point: `run_sweep()` is what `devpilot serve`'s timer and EventBridge end
up calling. Safe to run concurrently and repeatedly (see shared.delivery.queue.sweep).
"""

from __future__ import annotations

import time

import flask

from functions.runtime import get_runtime
from functions.telemetry import count, observe
from functions.web import Call, reply


def run_sweep() -> dict[str, int]:
    started = time.perf_counter()
    try:
        result = get_runtime().service.sweep()
    finally:  # a sweep that failed took its time too
        observe("sweep", time.perf_counter() - started)
    count("requeued", result.requeued)
    count("dead_lettered", result.dead_lettered)
    return {"requeued": result.requeued, "deadLettered": result.dead_lettered}


def sweep(call: Call) -> flask.Response:
    return reply(run_sweep())
