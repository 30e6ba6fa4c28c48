"""Each workspace's pace with Linear (`linear_paces`): Linear's rate limit is a wait, never a loss.

Linear limits each token (docs/linear-rate-limits.md). A call it refuses for that is not an
attempt: the org's posts (the refused one and every later one) wait until the time Linear gave,
then go in their order; the other orgs' posts go on at once. The wait is a row of the database,
written in the statement that puts the refused work back (`notice_ratelimited`,
`routing_ratelimited`), and read by every take of the outbox and of the router, so any number of
instances keep one pace per org.
"""

from __future__ import annotations

from typing import Any

from shared.linear.api import RateLimited
from shared.plumbing.db import Pool, lend
from shared.plumbing.sql import query


def params(org_id: str, refused: RateLimited) -> dict[str, Any]:
    """The parameters of `pace_refused`, for the statement that includes it."""
    return {"org_id": org_id, "seconds": refused.seconds, "budget": refused.budget[:100]}


def record(pool: Pool, org_id: str, refused: RateLimited) -> None:
    """A refusal that nothing else records (a read routing goes on without), on its own."""
    with lend(pool) as conn:
        conn.execute(query("pace_record"), params(org_id, refused))
