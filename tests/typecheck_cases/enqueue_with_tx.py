# The right way: passes mypy --strict.
from uuid import UUID

from shared.db import Pool, transaction
from shared.models import DispatchPayload, Enqueued, IssueRef
from shared.queue import enqueue_dispatch


def right(pool: Pool, orchestrator_id: UUID) -> Enqueued:
    with transaction(pool) as tx:
        return enqueue_dispatch(
            tx,
            org_id="o",
            orchestrator_id=orchestrator_id,
            linear_user_id=None,
            message=DispatchPayload(issue=IssueRef(id="i")),
        )
