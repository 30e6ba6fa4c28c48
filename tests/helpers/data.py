"""Test data helpers shared by the suite: orchestrators, issues, enqueued rows, row counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, LiteralString
from uuid import UUID

from shared.delivery.models import DispatchPayload, Enqueued
from shared.delivery.queue import enqueue_dispatch
from shared.plumbing.db import Pool, Tx, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.wire.messages import IssueRef, MessageKind


@dataclass
class Orch:
    id: UUID
    token: str
    org_id: str
    linear_user_id: str


MakeOrch = Callable[..., Orch]


def issue(n: int = 1, org: str = "org-a") -> IssueRef:
    return IssueRef(
        id=f"issue-{org}-{n}",
        identifier=f"ENG-{n}",
        title=f"Fix thing {n}",
        url=f"https://linear.app/acme/issue/ENG-{n}",
        description="details",
    )


def enqueue_one(pool: Pool, orch: Orch, n: int = 1) -> tuple[UUID, Enqueued]:
    """A session and its queue row, committed together."""
    iss = issue(n, orch.org_id)
    with transaction(pool) as tx:
        enq = enqueue_dispatch(
            tx,
            org_id=orch.org_id,
            orchestrator_id=orch.id,
            linear_user_id=orch.linear_user_id,
            message=DispatchPayload(issue=iss),
        )
    return enq.session_id, enq


FILL_SQL = """
WITH s AS (
    INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, issue_id)
    SELECT %(org)s, %(orch)s, 'queued', 'bulk-' || g FROM generate_series(1, %(n)s) g
    RETURNING id
)
INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload, available_at)
SELECT s.id, %(orch)s, %(org)s, '{"issue": {"id": "bulk"}}', now() - interval '1 minute' FROM s
"""
SYNC_SESSIONS_SQL = """
UPDATE dispatch_sessions ds SET queue_id = q.id, message_id = q.message_id
FROM dispatch_queue q WHERE q.session_id = ds.id AND ds.queue_id IS NULL
"""


def fill_queue(pool: Pool, orch: Orch, n: int) -> None:
    """Set-based test data: n queued sessions with their rows, for plan and scale checks."""
    with transaction(pool) as tx:
        # Setup, not the claim under test: the app pool's statement timeout must not cut it short
        # on a loaded machine (50,000 rows and their FK checks took longer once in CI).
        tx.execute("SET LOCAL statement_timeout = 0")
        tx.execute(FILL_SQL, {"org": orch.org_id, "orch": orch.id, "n": n})
        tx.execute(SYNC_SESSIONS_SQL)


def bulk(pool: Pool, statement: LiteralString, params: dict[str, Any] | None = None) -> None:
    """Test data written in bulk, in a transaction of its own that the pool's statement timeout
    (2 s, made for the service's statements) does not cut short on a loaded machine, as
    `fill_queue`'s."""
    with transaction(pool) as tx:
        tx.execute("SET LOCAL statement_timeout = 0")
        tx.execute(statement, params)


def write_notice(pool: Pool, org: str, agent_session: str, body: str) -> UUID:
    """One Linear notice in the outbox, committed and not sent (nothing posts after this commit)."""
    from shared.linear import notices

    with transaction(pool) as tx:
        nid = notices.write(
            tx,
            org_id=org,
            kind="dispatched",
            body=body,
            session_id=None,
            agent_session_id=agent_session,
            issue_id=None,
        )
    assert nid is not None, f"{org} is not an org Linear is told about"
    return nid


ENCRYPTION_KEY = "dGVzdHMtb25seS1lbmNyeXB0aW9uLWtleS0zMmJ5dGU="  # base64 of 32 bytes: tests only


def api_settings(**overrides: object) -> Settings:
    from tests.helpers.api import ADMIN, SECRET

    values: dict[str, object] = {
        "DEVPILOT_ADMIN_TOKEN": ADMIN,
        "LINEAR_WEBHOOK_SECRET": SECRET,
        "DEVPILOT_ENCRYPTION_KEYS": ENCRYPTION_KEY,
    }
    values.update(overrides)
    return Settings(**values)


ROW_COUNTS = """
SELECT (SELECT count(*) FROM dispatch_sessions) AS sessions, (SELECT count(*) FROM dispatch_queue) AS queue,
       (SELECT count(*) FROM webhook_deliveries) AS deliveries, (SELECT count(*) FROM orchestrators) AS orchestrators,
       (SELECT count(*) FROM linear_notices) AS notices
"""


def row_counts(pool: Pool) -> dict[str, int]:
    """How many rows each table holds: what "writes nothing" is checked against."""
    with pool.connection() as conn:
        row = conn.execute(ROW_COUNTS).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


def follow_up_in(tx: Tx, agent_session: str, machine: str, kind: MessageKind = "prompt") -> Enqueued:
    """As the intake transaction of a follow-up of `agent_session` (org-a, user-1, issue-as), in
    `tx`: the agent session's turn taken, and its message queued for `machine` (a prompt for the
    machine that has the conversation, or, `kind="start"`, the conversation started afresh). Both
    held until `tx` ends, as a follow-up being written holds them."""
    tx.execute(query("agent_session_turn_alone"), {"org_id": "org-a", "agent_session_id": agent_session})
    message = DispatchPayload(
        issue=IssueRef(id="issue-as", identifier="ENG-7"), agent_session_id=agent_session, kind=kind
    )
    return enqueue_dispatch(
        tx, org_id="org-a", orchestrator_id=UUID(machine), linear_user_id="user-1", message=message
    )


def queue_of(pool: Pool) -> list[tuple[str, str]]:
    """What is queued, in queue order: each row's machine and its session's status."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT q.orchestrator_id::text AS o, s.status FROM dispatch_queue q"
            " JOIN dispatch_sessions s ON s.id = q.session_id ORDER BY q.seq"
        ).fetchall()
    return [(r["o"], r["status"]) for r in rows]
