"""Routing policy: which orchestrator takes work for a Linear user (the `route` query says how)."""

from __future__ import annotations

from uuid import UUID

from shared.db import Tx, require_tx
from shared.sql import query


def route(tx: Tx, *, org_id: str, linear_user_id: str) -> UUID | None:
    """Runs in the intake transaction, so the choice and the dispatch commit together."""
    tx = require_tx(tx, "route")
    row = tx.one(query("route"), {"org_id": org_id, "linear_user_id": linear_user_id})
    return None if row is None else row["id"]
