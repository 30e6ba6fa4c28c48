"""`ack` (POST /ack): the orchestrator has journaled the message; the row is delivered.

Fenced by the claim token: only the latest claim's token acks (even after its lease expired and
the row was re-queued, as long as no newer claim exists). Batch form: one transaction, each item
judged as the single form would judge it. An ack that lands is one statement, so one round trip:
who is calling, that it was seen, and the acks (`ack_as` in shared/queries/queue.sql).
"""

from __future__ import annotations

import flask

from functions.fleet_bodies import AckBody, loose_uuid
from functions.telemetry import count
from functions.web import ApiError, Call, bearer, note, reply, require_orchestrator
from shared.dispatch import NOT_FOUND, NOT_LATEST, AckItem, Refused

STATUS = {"acked": 200, "claim_superseded": 409, "not_found": 404}
# What a release that missed is told (an ack is told more: shared.delivery.queue judges each item).
DETAIL = {"claim_superseded": NOT_LATEST, "not_found": NOT_FOUND}


def ack(call: Call) -> flask.Response:
    try:
        body = call.body(AckBody)
        items = _items(body)
    except ApiError:
        require_orchestrator(call.request, call.rt)  # a wrong token hears 401 before its body is judged
        raise
    try:
        orch, judged = call.service.ack(bearer(call.request) or "", items)
    except Refused as exc:
        raise ApiError(401, exc.code, exc.detail) from None
    results = judged.statuses
    note(orchestratorId=orch.id)
    count("acked", results.count("acked"))
    if body.acks is not None:
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
    note(queueId=body.queue_id)
    [result] = results
    if result == "acked":
        return reply({"status": "acked"})
    raise ApiError(STATUS[result], result, judged.details[0])


def _items(body: AckBody) -> list[AckItem]:
    """The acks asked for: the batch form's list, or the single form's one."""
    if body.acks is not None:
        if body.queue_id is not None or body.claim_token is not None:
            raise ApiError(400, "bad_request", "send either queueId/claimToken or acks, not both")
        return [AckItem(loose_uuid(a.queue_id), loose_uuid(a.claim_token)) for a in body.acks]
    if body.queue_id is None or body.claim_token is None:
        raise ApiError(400, "bad_request", "queueId and claimToken are required (or an acks list)")
    return [AckItem(loose_uuid(body.queue_id), loose_uuid(body.claim_token))]
