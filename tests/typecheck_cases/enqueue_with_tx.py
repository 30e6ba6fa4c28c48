# The right way: passes mypy --strict.
from uuid import UUID

from shared.delivery.models import DispatchPayload, Enqueued
from shared.delivery.queue import RouteOutcome, enqueue_dispatch, route_and_enqueue
from shared.plumbing.db import Pool, statement, transaction
from shared.wire.messages import IssueRef


def right(pool: Pool, orchestrator_id: UUID) -> Enqueued:
    with transaction(pool) as tx:
        return enqueue_dispatch(
            tx,
            org_id="o",
            orchestrator_id=orchestrator_id,
            linear_user_id=None,
            message=DispatchPayload(issue=IssueRef(id="i")),
        )


def right_in_one_statement(pool: Pool) -> RouteOutcome:
    with statement(pool) as tx:
        return route_and_enqueue(
            tx,
            org_id="o",
            linear_user_id="u",
            message=DispatchPayload(issue=IssueRef(id="i")),
            delivery_key="k",
            content_key="c",
        )
