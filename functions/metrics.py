"""`metrics` target (GET /metrics): Prometheus text, admin bearer, off unless DEVPILOT_METRICS=1.

Counters and histograms are this instance's (with several `devpilot serve` workers, every worker's,
summed); queue depth by orchestrator is read from the table at scrape time, so every instance
reports the same truth.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import flask
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from functions.runtime import get_runtime
from functions.telemetry import meters
from functions.web import ApiError, Call
from shared.dispatch import snapshot


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
        refused = CounterMetricFamily(
            "devpilot_linear_ratelimited_answers",
            "Calls Linear refused for its rate limit (RATELIMITED), per org: none of them an attempt",
            labels=["org_id"],
        )
        paced = GaugeMetricFamily(
            "devpilot_linear_paced_seconds",
            "How long an org's posts still wait for Linear's rate limit (0: they do not)",
            labels=["org_id"],
        )
        snap = snapshot(get_runtime().pool, with_sessions=False)  # (what it shows reads no session)
        for o in snap.orchestrators:
            depth.add_metric([o.id, o.name, "queued"], o.queued)
            depth.add_metric([o.id, o.name, "claimed"], o.claimed)
            oldest.add_metric([o.id, o.name], o.oldest_due_s or 0.0)
        for c in snap.linear:
            connected.add_metric([c["org_id"]], 1.0 if c["disconnected_at"] is None else 0.0)
            refused.add_metric([c["org_id"]], float(c["ratelimited"]))
            left = (c["paced_until"] - snap.taken_at).total_seconds() if c["paced_until"] else 0.0
            paced.add_metric([c["org_id"]], max(left, 0.0))
        yield depth
        yield oldest
        yield connected
        yield refused
        yield paced


def _scraped() -> CollectorRegistry:
    """What a scrape reads: this process's registry; or, in prometheus_client's multiprocess mode
    (`devpilot serve` with several workers sets PROMETHEUS_MULTIPROC_DIR), the counts every
    process of the server wrote to that directory, summed, whichever worker answers."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        meters()  # (this worker's metrics exist, at zero, even before its first count)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # (untyped in prometheus_client)
    else:
        registry = meters().registry
    registry.register(QueueDepth())
    return registry


SCRAPED = _scraped()  # (once, at import: the import lock keeps two first scrapes from both making it)


def metrics(call: Call) -> flask.Response:
    if not call.rt.settings.metrics_enabled:
        raise ApiError(404, "not_found", "metrics are off; set DEVPILOT_METRICS=1")
    return flask.Response(generate_latest(SCRAPED), mimetype="text/plain; version=0.0.4")
