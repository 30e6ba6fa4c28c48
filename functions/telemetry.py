"""This instance's counters and histograms (Prometheus), kept apart from the route that serves them
so every handler can count without import cycles.

They count only while metrics are on (`DEVPILOT_METRICS`), and prometheus_client is imported on the
first count then: a function target that never serves /metrics does not load it on a cold start.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Literal, NamedTuple

from functions.runtime import current

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Histogram

Counted = Literal["claimed", "acked", "released", "dead_lettered", "requeued"]
Timed = Literal["webhook", "claim", "sweep"]
TIMED_ROUTES: dict[str, Timed] = {"webhook": "webhook", "claim": "claim"}  # (the sweep times itself)


class Meters(NamedTuple):
    registry: CollectorRegistry
    counters: dict[str, Counter]
    timers: dict[str, Histogram]


_lock = threading.Lock()
_meters: Meters | None = None


def meters() -> Meters:
    """The registry and its metrics, made once per process on first use (as get_runtime is)."""
    global _meters
    if _meters is not None:
        return _meters
    with _lock:
        if _meters is None:
            from prometheus_client import CollectorRegistry, Counter, Histogram

            registry = CollectorRegistry(auto_describe=True)

            def counter(name: str, doc: str) -> Counter:
                return Counter(f"devpilot_{name}_messages", doc, registry=registry)

            claim_buckets = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 30)
            _meters = Meters(
                registry,
                counters={
                    "claimed": counter("claimed", "Messages handed out by /claim"),
                    "acked": counter("acked", "Messages acked (delivered)"),
                    "released": counter("released", "Claims released"),
                    "dead_lettered": counter("dead_lettered", "Rows dead-lettered (session failed)"),
                    "requeued": counter("requeued", "Expired leases re-queued by the sweep"),
                },
                timers={
                    "webhook": Histogram(
                        "devpilot_webhook_seconds", "Webhook handling time", registry=registry
                    ),
                    "claim": Histogram(
                        "devpilot_claim_seconds",
                        "Claim handling time (long-polls included)",
                        buckets=claim_buckets,
                        registry=registry,
                    ),
                    "sweep": Histogram("devpilot_sweep_seconds", "Sweep duration", registry=registry),
                },
            )
        return _meters


def _on() -> bool:
    rt = current()  # (never builds the runtime: a request that failed before it counts nothing)
    return rt is not None and rt.settings.metrics_enabled


def count(name: Counted, n: int = 1) -> None:
    if n and _on():
        meters().counters[name].inc(n)


def observe(name: Timed, seconds: float) -> None:
    if _on():
        meters().timers[name].observe(seconds)


def observe_route(route: str, seconds: float) -> None:
    """A request's time, for the routes that are timed."""
    if route in TIMED_ROUTES:
        observe(TIMED_ROUTES[route], seconds)
