"""Routing policy: which orchestrator takes work for a Linear user."""

from __future__ import annotations

from uuid import UUID

from shared.db import Tx, require_tx

# The active orchestrator registered for (org, Linear user), most recently seen first, then the
# newest registration. Served by orchestrators_route_idx.
ROUTE = """
SELECT id FROM orchestrators
WHERE org_id = %(org_id)s AND linear_user_id = %(linear_user_id)s AND revoked_at IS NULL
ORDER BY last_seen_at DESC NULLS LAST, created_at DESC, id
LIMIT 1"""


def route(tx: Tx, *, org_id: str, linear_user_id: str) -> UUID | None:
    """Runs in the intake transaction, so the choice and the dispatch commit together."""
    tx = require_tx(tx, "route")
    row = tx.one(ROUTE, {"org_id": org_id, "linear_user_id": linear_user_id})
    return None if row is None else row["id"]
