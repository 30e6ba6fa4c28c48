"""`metrics` target (GET /metrics): Prometheus text, admin bearer, off unless DEVPILOT_METRICS=1.

Counters and histograms are this instance's; queue depth by orchestrator is read from the table
at scrape time, so every instance reports the same truth.
"""

from __future__ import annotations

from collections.abc import Iterator

import flask
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from functions.runtime import get_runtime
from functions.telemetry import meters
from functions.web import ApiError, Call
from shared.status import snapshot


class QueueDepth(Collector):
    def describe(self) -> list[Metric]:
        return []  # so registering does not read the database at import time

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "devpilot_queue_depth",
            "Live queue rows by orchestrator and state",
            labels=["orchestrator_id", "orchestrator", "state"],
        )
        oldest = GaugeMetricFamily(
            "devpilot_oldest_due_seconds",
            "Age of the oldest due, unclaimed row",
            labels=["orchestrator_id", "orchestrator"],
        )
        connected = GaugeMetricFamily(
            "devpilot_linear_connected",
            "1 while an org's Linear connection works, 0 once disconnected (its posts wait)",
            labels=["org_id"],
        )
        snap = snapshot(get_runtime().pool, failed_limit=0, with_history=False)
        for o in snap.orchestrators:
            depth.add_metric([o.id, o.name, "queued"], o.queued)
            depth.add_metric([o.id, o.name, "claimed"], o.claimed)
            oldest.add_metric([o.id, o.name], o.oldest_due_s or 0.0)
        for c in snap.linear:
            connected.add_metric([c["org_id"]], 1.0 if c["disconnected_at"] is None else 0.0)
        yield depth
        yield oldest
        yield connected


meters().registry.register(QueueDepth())


def metrics(call: Call) -> flask.Response:
    if not call.rt.settings.metrics_enabled:
        raise ApiError(404, "not_found", "metrics are off; set DEVPILOT_METRICS=1")
    return flask.Response(generate_latest(meters().registry), mimetype="text/plain; version=0.0.4")
