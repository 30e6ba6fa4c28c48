"""The operators' figures, read-only: where work is stuck, what failed and why, whether the sweep runs.

One snapshot feeds `devpilot status`, the dashboard and the metrics, so they always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.plumbing.db import Pool, lend
from shared.plumbing.sql import query
from shared.wire.messages import DEFAULT_HOST


def format_age(seconds: float | None) -> str:
    """How long the oldest due row has waited, as people read it ("4m 05s", "2h 10m")."""
    if seconds is None:
        return "—"
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m {s % 60:02d}s"


@dataclass(frozen=True)
class OrchestratorRow:
    id: str
    org_id: str
    linear_user_id: str
    name: str
    active: bool
    queued: int
    claimed: int
    oldest_due_s: float | None
    attempts: int
    last_seen_at: datetime | None
    repositories: list[str] = field(default_factory=list)  # `owner/name` (host too, if not GitHub)
    labels: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Snapshot:
    orchestrators: list[OrchestratorRow]
    failed: list[dict[str, Any]]
    last_sweep: dict[str, Any] | None
    totals: dict[str, int]
    history: list[dict[str, Any]]
    taken_at: datetime
    linear: list[dict[str, Any]] = field(default_factory=list)  # each org's Linear connection

    def to_json(self) -> dict[str, Any]:
        def conv(v: Any) -> Any:
            if isinstance(v, datetime):
                return v.isoformat()
            if isinstance(v, dict):
                return {k: conv(x) for k, x in v.items()}
            if isinstance(v, list):
                return [conv(x) for x in v]
            return str(v) if v is not None and not isinstance(v, int | float | str | bool) else v

        out: dict[str, Any] = conv(
            {
                "takenAt": self.taken_at,
                "totals": self.totals,
                "orchestrators": [
                    {
                        "orchestratorId": o.id,
                        "orgId": o.org_id,
                        "linearUserId": o.linear_user_id,
                        "name": o.name,
                        "active": o.active,
                        "queued": o.queued,
                        "claimed": o.claimed,
                        "oldestDueSeconds": o.oldest_due_s,
                        "attempts": o.attempts,
                        "lastSeenAt": o.last_seen_at,
                        "repositories": o.repositories,
                        "labels": o.labels,
                    }
                    for o in self.orchestrators
                ],
                "recentFailed": [
                    {
                        "sessionId": f["id"],
                        "orgId": f["org_id"],
                        "orchestratorId": f["orchestrator_id"],
                        "issue": f["issue_identifier"],
                        "reason": f["failure_reason"],
                        "failedAt": f["updated_at"],
                    }
                    for f in self.failed
                ],
                "lastSweep": None
                if self.last_sweep is None
                else {
                    "ranAt": self.last_sweep["ran_at"],
                    "requeued": self.last_sweep["requeued"],
                    "deadLettered": self.last_sweep["dead_lettered"],
                },
                "history": [
                    {"minute": h["minute"], "depth": h["depth"], "latencySeconds": h["latency_s"]}
                    for h in self.history
                ],
                "linear": [
                    {
                        "orgId": c["org_id"],
                        "kind": c["kind"],
                        "workspace": c["workspace_name"],
                        "connected": c["disconnected_at"] is None,
                        "disconnectReason": c["disconnect_reason"],
                        "expiresAt": c["expires_at"],
                        "rateLimitedUntil": c["paced_until"],
                        "rateLimitedAnswers": c["ratelimited"],
                    }
                    for c in self.linear
                ],
            }
        )
        return out


def pace_text(c: dict[str, Any]) -> str:
    """An org's pace with Linear, as `devpilot status` and the dashboard say it."""
    refused = f"{c['ratelimited']} refused so far" if c["ratelimited"] else "never refused"
    if c["paced_until"] is None:
        return f"not waiting ({refused})"
    return (
        f"waiting for Linear's rate limit until {c['paced_until'].isoformat(timespec='seconds')}"
        f" ({c['ratelimit_budget'] or 'budget'} spent; {refused})"
    )


def _shown(repository: dict[str, str]) -> str:
    host, name = repository.get("hostname", ""), repository.get("fullName", "")
    return name if host == DEFAULT_HOST else f"{host}/{name}"


def snapshot(
    pool: Pool, *, failed_limit: int = 20, with_history: bool = True, with_sessions: bool = True
) -> Snapshot:
    """`with_sessions=False` (a metrics scrape, which shows none of them): no totals, failures or
    history (`failed_limit` and `with_history` are then ignored), so the sessions, which are kept
    and grow for ever, are not read at all (their totals count every one, and a scrape comes
    every few seconds)."""
    with lend(pool) as conn, conn.transaction():
        conn.execute(query("read_only"))
        orchs = [
            OrchestratorRow(
                str(r["id"]),
                r["org_id"],
                r["linear_user_id"],
                r["name"],
                r["revoked_at"] is None,
                r["queued"],
                r["claimed"],
                r["oldest_due_s"],
                int(r["attempts"]),
                r["last_seen_at"],
                [_shown(x) for x in r["repositories"]],
                list(r["labels"]),
            )
            for r in conn.execute(query("status_per_orchestrator"))
        ]
        failed: list[dict[str, Any]] = []
        totals: dict[str, int] = {}
        history: list[dict[str, Any]] = []
        if with_sessions:
            failed = [dict(r) for r in conn.execute(query("status_recent_failed"), {"limit": failed_limit})]
            totals = {r["status"]: int(r["n"]) for r in conn.execute(query("status_totals"))}
            if with_history:
                history = [dict(r) for r in conn.execute(query("status_history"))]
        sweep_row = conn.execute(query("status_last_sweep")).fetchone()
        linear = [dict(r) for r in conn.execute(query("credentials_list"))]
        now = conn.execute(query("status_now")).fetchone()
    assert now is not None
    return Snapshot(orchs, failed, dict(sweep_row) if sweep_row else None, totals, history, now["t"], linear)
