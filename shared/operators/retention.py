"""What is kept, and for how long: the sweep forgets finished conversations older than
DEVPILOT_RETENTION_DAYS (default 90; 0 keeps everything), in bounded batches.

A conversation (an agent session's messages, or a plain assignment's one session, with every post
to Linear, routing request, claim record, dead letter and operator's action that belongs to it) is
forgotten whole, once it is finished (nothing of it queued, no post unsent, no routing request
open) and its last change is older than the retention; never while it is live, whatever its age.
Each batch is one short transaction (`retention_pick`, `retention_forget` and `retention_walked` in
shared/queries/retention.sql) that takes, without waiting, the locks the intake, a machine's post
and an operator's action take for that conversation, so none of them waits more than a batch, and
none of them writes into a conversation while it is being forgotten. The batches walk the tables
from where the last one stopped, so conversations kept (live) are passed over, not read again and
again at the head of the walk.
"""

from __future__ import annotations

from typing import NamedTuple

from shared.plumbing import deadline
from shared.plumbing.db import Pool, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query

BATCH = 100  # rows each walk looks at per batch
BATCHES = 20  # batches per sweep at most (the next sweep goes on)


class Forgotten(NamedTuple):
    conversations: int = 0
    sessions: int = 0
    posts: int = 0
    routes: int = 0
    records: int = 0


def forget(pool: Pool, settings: Settings, *, batch: int = BATCH, batches: int = BATCHES) -> Forgotten:
    """Forget what is past the retention, a batch per transaction, until every walk reached the
    cutoff or `batches` were done. Nothing when the retention is 0, or when another sweep is
    forgetting at this moment (it holds the walks)."""
    days = settings.retention_days
    total = Forgotten()
    if days == 0:
        return total
    for _ in range(batches):
        # (each batch a step of the sweep, with the sweep's deadline of its own)
        with deadline.bound(settings.sweep_deadline_seconds), transaction(pool) as tx:
            rows = tx.all(query("retention_pick"), {"days": days, "batch": batch})
            walks = [r for r in rows if r["kind"] == "cursor"]
            if not walks:
                return total  # (another sweep holds the walks)
            conversations = [r for r in rows if r["kind"] == "conversation"]
            done = tx.one(
                query("retention_forget"),
                {
                    "days": days,
                    "orgs": [c["org_id"] for c in conversations],
                    "keys": [c["key"] for c in conversations],
                    "agents": [c["agent"] for c in conversations],
                },
            )
            tx.execute(
                query("retention_walked"),
                {
                    "walks": [w["walk"] for w in walks],
                    "ats": [w["at"] for w in walks],
                    "ids": [w["id"] for w in walks],
                },
            )
        assert done is not None
        total = Forgotten(*(a + int(done[f]) for a, f in zip(total, Forgotten._fields, strict=True)))
        if all(w["at"] is None for w in walks):  # every walk reached the cutoff: from the start next time
            return total
    return total
