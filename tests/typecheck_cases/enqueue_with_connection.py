# Deliberately wrong: mypy --strict must reject passing a connection where a Tx is required.
from uuid import uuid4

import psycopg
from psycopg.rows import dict_row

from shared.delivery.models import DispatchPayload
from shared.delivery.queue import enqueue_dispatch, route_and_enqueue
from shared.wire.messages import IssueRef


def wrong(url: str) -> None:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        enqueue_dispatch(
            conn,
            org_id="o",
            orchestrator_id=uuid4(),
            linear_user_id=None,
            message=DispatchPayload(issue=IssueRef(id="i")),
        )
        route_and_enqueue(
            conn,
            org_id="o",
            linear_user_id="u",
            message=DispatchPayload(issue=IssueRef(id="i")),
            delivery_key="k",
            content_key="c",
        )
