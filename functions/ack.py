"""`ack` (POST /ack): the orchestrator has journaled the message; the row is delivered.

Fenced by the claim token: only the latest claim's token acks (even after its lease expired and
the row was re-queued, as long as no newer claim exists). Batch form: one transaction, each item
judged as the single form would judge it.
"""

from __future__ import annotations

import flask

from functions.bodies import AckBody, loose_uuid
from functions.telemetry import count
from functions.web import ApiError, Call, note, reply
from shared.queue import AckItem

STATUS = {"acked": 200, "claim_superseded": 409, "not_found": 404}
DETAIL = {
    "claim_superseded": "a newer claim owns this row; drop this copy",
    "not_found": "no such queue row for this orchestrator",
}


def ack(call: Call) -> flask.Response:
    body = call.body(AckBody)
    if body.acks is not None:
        if body.queue_id is not None or body.claim_token is not None:
            raise ApiError(400, "bad_request", "send either queueId/claimToken or acks, not both")
        items = [AckItem(loose_uuid(a.queue_id), loose_uuid(a.claim_token)) for a in body.acks]
        results = call.service.ack(call.orch.id, items)
        count("acked", results.count("acked"))
        note(queueId=",".join(a.queue_id for a in body.acks[:5]), acked=results.count("acked"))
        return reply(
            {
                "results": [
                    {"queueId": a.queue_id, "status": r}
                    if r == "acked"
                    else {"queueId": a.queue_id, "error": r}
                    for a, r in zip(body.acks, results, strict=True)
                ]
            }
        )
    if body.queue_id is None or body.claim_token is None:
        raise ApiError(400, "bad_request", "queueId and claimToken are required (or an acks list)")
    note(queueId=body.queue_id)
    [result] = call.service.ack(
        call.orch.id, [AckItem(loose_uuid(body.queue_id), loose_uuid(body.claim_token))]
    )
    if result == "acked":
        count("acked")
        return reply({"status": "acked"})
    raise ApiError(STATUS[result], result, DETAIL[result])
