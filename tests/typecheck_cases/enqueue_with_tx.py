# The right way: passes mypy --strict.
from uuid import UUID

from shared.db import Pool, transaction
from shared.models import DispatchPayload, Enqueued, IssueRef
from shared.queue import create_session, enqueue_dispatch


def right(pool: Pool, orchestrator_id: UUID) -> Enqueued:
    with transaction(pool) as tx:
        sid = create_session(
            tx, org_id="o", orchestrator_id=orchestrator_id, linear_user_id=None, issue=IssueRef(id="i")
        )
        return enqueue_dispatch(
            tx,
            org_id="o",
            orchestrator_id=orchestrator_id,
            session_id=sid,
            message=DispatchPayload(issue=IssueRef(id="i")),
        )
