"""`release` (POST /release): give a claim back now; it counts as a failed attempt, with the same
backoff and dead-lettering as an expired lease."""

from __future__ import annotations

import flask

from functions.ack import DETAIL, STATUS
from functions.fleet_bodies import ReleaseBody, loose_uuid
from functions.telemetry import count
from functions.web import ApiError, Call, note, reply


def release(call: Call) -> flask.Response:
    body = call.body(ReleaseBody)
    note(queueId=body.queue_id)
    r = call.service.release(
        call.orch.id, loose_uuid(body.queue_id), loose_uuid(body.claim_token), body.reason
    )
    if r.status != "released":
        raise ApiError(STATUS[r.status], r.status, DETAIL[r.status])
    count("released")
    count("dead_lettered", int(r.dead_lettered))
    return reply(
        {
            "status": "released",
            "availableAt": r.available_at.isoformat() if r.available_at else None,
            "deadLettered": r.dead_lettered,
            "rerouted": r.rerouted,
        }
    )
