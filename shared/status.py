"""The operators' figures, read-only: where work is stuck, what failed and why, whether the sweep runs.

One snapshot feeds `devpilot status`, the dashboard and the metrics, so they always agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.db import Pool

# Per orchestrator: live rows by state, how long the oldest due row has waited, attempts so far.
# Reads the queue through its orchestrator index; the hot table holds only live work.
PER_ORCHESTRATOR = """
SELECT o.id, o.org_id, o.linear_user_id, o.name, o.last_seen_at, o.revoked_at,
       count(q.id) FILTER (WHERE q.lease_expires_at IS NULL) AS queued,
       count(q.id) FILTER (WHERE q.lease_expires_at IS NOT NULL) AS claimed,
       extract(epoch FROM now() - min(q.available_at)
               FILTER (WHERE q.lease_expires_at IS NULL AND q.available_at <= now()))::float AS oldest_due_s,
       coalesce(sum(q.attempts), 0) AS attempts
FROM orchestrators o
LEFT JOIN dispatch_queue q ON q.orchestrator_id = o.id
GROUP BY o.id
ORDER BY count(q.id) DESC, o.last_seen_at DESC NULLS LAST, o.created_at"""
# The most recent failures (dead letters, releases at the limit), newest first.
RECENT_FAILED = """
SELECT s.id, s.org_id, s.orchestrator_id, s.issue_identifier, s.failure_reason, s.updated_at
FROM dispatch_sessions s
WHERE s.status = 'failed'
ORDER BY s.updated_at DESC
LIMIT %(limit)s"""
LAST_SWEEP = "SELECT ran_at, requeued, dead_lettered FROM sweep_runs ORDER BY id DESC LIMIT 1"
# Minute by minute over the last hour, derived from the sessions themselves: how many were
# undelivered at the end of each minute, and the mean webhook-to-ack time of those acked in it.
HISTORY = """
WITH minutes AS (
    SELECT generate_series(date_trunc('minute', now()) - interval '59 minutes',
                           date_trunc('minute', now()), interval '1 minute') AS m
)
SELECT m.m AS minute,
       (SELECT count(*) FROM dispatch_sessions s
         WHERE s.created_at < m.m + interval '1 minute'
           AND (s.status = 'queued' OR s.updated_at >= m.m + interval '1 minute')) AS depth,
       (SELECT avg(extract(epoch FROM s.delivered_at - s.created_at))::float FROM dispatch_sessions s
         WHERE s.delivered_at >= m.m AND s.delivered_at < m.m + interval '1 minute') AS latency_s
FROM minutes m
ORDER BY m.m"""
TOTALS = "SELECT status, count(*) AS n FROM dispatch_sessions GROUP BY status"


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


@dataclass(frozen=True)
class Snapshot:
    orchestrators: list[OrchestratorRow]
    failed: list[dict[str, Any]]
    last_sweep: dict[str, Any] | None
    totals: dict[str, int]
    history: list[dict[str, Any]]
    taken_at: datetime

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
            }
        )
        return out


def snapshot(pool: Pool, *, failed_limit: int = 20, with_history: bool = True) -> Snapshot:
    with pool.connection() as conn, conn.transaction():
        conn.execute("SET TRANSACTION READ ONLY")
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
            )
            for r in conn.execute(PER_ORCHESTRATOR)
        ]
        failed = [dict(r) for r in conn.execute(RECENT_FAILED, {"limit": failed_limit})]
        sweep_row = conn.execute(LAST_SWEEP).fetchone()
        totals = {r["status"]: int(r["n"]) for r in conn.execute(TOTALS)}
        history = [dict(r) for r in conn.execute(HISTORY)] if with_history else []
        now = conn.execute("SELECT now() AS t").fetchone()
    assert now is not None
    return Snapshot(orchs, failed, dict(sweep_row) if sweep_row else None, totals, history, now["t"])
