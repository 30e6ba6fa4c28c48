"""`machine` (POST /machine): what a machine has, the repositories checked out on it and its labels.

Sent by the orchestrator every time it starts; it replaces what the machine said before, so a
change needs no admin. Routing reads it (`shared.fleet.machines`, `shared.delivery.repository_choice`).
"""

from __future__ import annotations

import flask

from functions.bodies import MachineBody
from functions.web import ApiError, Call, note, reply
from shared.dispatch import machines
from shared.wire.messages import Repository


def machine(call: Call) -> flask.Response:
    body = call.body(MachineBody)
    described = machines.describe(
        call.rt.pool,
        call.orch.id,
        [Repository(r.hostname, r.full_name) for r in body.repositories],
        body.labels,
    )
    if described is None:  # revoked between its authentication and this statement
        raise ApiError(401, "unauthorized", "this orchestrator was revoked")
    note(repositories=len(described.repositories), labels=len(described.labels))
    return reply(
        {
            "orchestratorId": str(described.orchestrator_id),
            "name": described.name,
            "repositories": described.repositories,
            "labels": described.labels,
        }
    )
