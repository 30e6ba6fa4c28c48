"""This instance's counters and histograms (Prometheus), kept apart from the route that serves them
so every handler can count without import cycles."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)
CLAIMED = Counter("devpilot_claimed_messages", "Messages handed out by /claim", registry=REGISTRY)
ACKED = Counter("devpilot_acked_messages", "Messages acked (delivered)", registry=REGISTRY)
RELEASED = Counter("devpilot_released_messages", "Claims released", registry=REGISTRY)
DEAD = Counter("devpilot_dead_lettered_messages", "Rows dead-lettered (session failed)", registry=REGISTRY)
REQUEUED = Counter("devpilot_requeued_messages", "Expired leases re-queued by the sweep", registry=REGISTRY)
WEBHOOK_SECONDS = Histogram("devpilot_webhook_seconds", "Webhook handling time", registry=REGISTRY)
CLAIM_SECONDS = Histogram(
    "devpilot_claim_seconds",
    "Claim handling time (long-polls included)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 30),
    registry=REGISTRY,
)
SWEEP_SECONDS = Histogram("devpilot_sweep_seconds", "Sweep duration", registry=REGISTRY)
ROUTE_HISTOGRAMS = {"webhook": WEBHOOK_SECONDS, "claim": CLAIM_SECONDS}
