"""Routing that must ask Linear first: after the webhook's transaction, never inside Linear's 5 s.

An agent session started by an automation names no creator, and Linear's webhook issue object has
no assignee; the session goes to the machine of the issue's assignee, which only Linear's API can
say. The webhook's transaction writes a `routing_requests` row (`request`), answers Linear, and
after the commit this module asks Linear and routes, in one transaction per request:
- the agent session already held by a machine (a follow-up that waited behind the start): the
  message goes to that machine, as every follow-up does;
- an assignee with an active machine: the start is queued for it, with "Queued for <machine>";
- no assignee, an assignee without a machine, an org not connected: Linear hears why (`error`).
A read that fails (Linear down) is retried with the outbox's backoff by the sweep, and given up
past the attempt limit, Linear told. Each request is done once (a compare-and-set on `done_at`), in
the transaction that queues its message; a stop of the agent session cancels its open requests in
its own transaction, and both take the agent session's turn, so a routing never queues a start a
stop has cancelled. One agent session's requests are routed in the order they were written.

The same table and steps serve any routing that must ask Linear (the repository a start needs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from shared import linear_api, notices
from shared.db import Pool, Tx, lend, require_tx, take_in_rounds, transaction
from shared.models import DispatchPayload
from shared.queue import MachineRevoked, enqueue_dispatch
from shared.settings import Settings
from shared.sql import query

log = logging.getLogger("devpilot.routing")

ASSIGNEE = """query DevpilotIssueAssignee($id: String!) {
  issue(id: $id) { id assignee { id name } }
}"""
NO_ASSIGNEE = (
    "This issue has no assignee, so devpilot does not know whose machine should take it. Assign it "
    "to someone who has a machine connected to devpilot, then mention the agent again."
)
NOT_CONNECTED = (
    "This workspace's Linear connection is missing or was revoked, so devpilot cannot ask Linear "
    "who the issue is assigned to. Ask an admin to install the app again."
)
GAVE_UP = "devpilot could not ask Linear who this issue is assigned to ({error}); nothing was dispatched."
ROUNDS = 3  # a machine revoked while its start was being written: decided again, as the intake does


def request(
    tx: Tx, *, org_id: str, message: DispatchPayload, delivery_key: str | None, need: str = "assignee"
) -> UUID:
    """In the webhook's transaction: route `message` after commit, once Linear says what is needed."""
    tx = require_tx(tx, "routing.request")
    row = tx.one(
        query("routing_request_insert"),
        {
            "org_id": org_id,
            "agent_session_id": message.agent_session_id,
            "issue_id": message.issue.id,
            "need": need,
            "message": Jsonb(message.model_dump(mode="json", by_alias=True)),
            "delivery_key": delivery_key,
        },
    )
    assert row is not None
    return UUID(str(row["id"]))


def waiting(tx: Tx, org_id: str, agent_session_id: str) -> bool:
    """In the intake transaction, after the agent session's turn: is an earlier message of this
    agent session still waiting to be routed? (A follow-up then waits behind it.)"""
    row = require_tx(tx, "routing.waiting").one(
        query("routing_open_for_agent_session"), {"org_id": org_id, "agent_session_id": agent_session_id}
    )
    return bool(row and row["open"])


def cancel(tx: Tx, org_id: str, agent_session_id: str) -> int:
    """In a stop's transaction (after the agent session's turn): its open requests are done."""
    rows = require_tx(tx, "routing.cancel").all(
        query("routing_cancel_agent_session"), {"org_id": org_id, "agent_session_id": agent_session_id}
    )
    return len(rows)


@dataclass
class Result:
    routed: int = 0
    retried: int = 0
    notice_ids: list[UUID] = field(default_factory=list)


def run(pool: Pool, settings: Settings, ids: list[UUID] | None = None, limit: int = 50) -> Result:
    """Route the due requests (the named ones, or any), then post what Linear must hear. Never
    raises for Linear's answers: a failed read is due again later. A request held back by an
    earlier one of its agent session (the order rule) is looked for again at once, once that one
    is done, instead of waiting for the sweep."""
    result = Result()

    def handle(rows: list[Any]) -> list[str]:
        for row in rows:
            _route_one(pool, settings, dict(row), result)
        return [r["agent_session_id"] for r in rows if r["agent_session_id"]]

    take_in_rounds(pool, "routing_take", {"ids": ids, "limit": limit}, handle)
    if result.notice_ids:
        notices.send_pending(pool, settings, ids=result.notice_ids)
    return result


def _route_one(pool: Pool, settings: Settings, row: dict[str, Any], result: Result) -> None:
    message = DispatchPayload.model_validate(row["message"])
    org = row["org_id"]
    assignee: str | None = None
    outcome: str | None = None
    if _holder(pool, org, message.agent_session_id) is None:  # else: no need to ask Linear
        try:
            data = linear_api.graphql(pool, settings, org, ASSIGNEE, {"id": row["issue_id"]})
            person = ((data.get("issue") or {}).get("assignee") or {}) if isinstance(data, dict) else {}
            assignee = person.get("id") if isinstance(person.get("id"), str) else None
            outcome = None if assignee else "no_assignee"
        except linear_api.NotConnected:
            outcome = "not_connected"
        except linear_api.Unavailable as exc:
            _failed(pool, settings, row, message, str(exc), result)
            return
    for attempt in range(ROUNDS):
        try:
            with transaction(pool) as tx:
                _decide(tx, row, message, assignee, outcome, result)
            return
        except MachineRevoked:
            if attempt == ROUNDS - 1:  # (each round needs a revoke committed during it)
                _failed(pool, settings, row, message, "its machines kept changing", result)


def _decide(
    tx: Tx,
    row: dict[str, Any],
    message: DispatchPayload,
    assignee: str | None,
    outcome: str | None,
    result: Result,
) -> None:
    """In one transaction, after the agent session's turn: queue the message (to the machine that
    holds the agent session, or the assignee's) or tell Linear why nothing can take it; the
    request done with it. Nothing, if a stop cancelled the request meanwhile."""
    org, agent = row["org_id"], message.agent_session_id
    tx.execute(query("agent_session_turn_alone"), {"org_id": org, "agent_session_id": agent})
    if tx.one(query("routing_lock_open"), {"id": row["id"]}) is None:
        return  # done meanwhile (a stop cancelled it)
    holder = tx.one(
        query("agent_session_holder"), {"org_id": org, "agent_session_id": agent, "delivered_only": False}
    )
    machine: UUID | None = None
    kind = message.kind
    if holder is not None:  # the conversation has a machine: the message follows it, never re-routed
        machine, kind = holder["orchestrator_id"], ("prompt" if message.kind != "stop" else "stop")
    elif assignee is not None:
        routed = tx.one(query("routed_machine"), {"org_id": org, "route_user": assignee})
        machine, kind = (routed["id"] if routed else None), "start"
        outcome = None if routed else "no_machine"
    if machine is None:
        body = {
            "no_assignee": NO_ASSIGNEE,
            "not_connected": NOT_CONNECTED,
            "no_machine": "No machine is registered in devpilot for the issue's assignee; "
            "nothing was dispatched.",
        }[outcome or "no_machine"]
        _done(tx, row, outcome or "no_machine", None)
        _tell(tx, row, message, body, result)
        return
    payload = message.model_copy(update={"kind": kind})
    enq = enqueue_dispatch(
        tx,
        org_id=org,
        orchestrator_id=machine,
        linear_user_id=assignee,
        message=payload,
        delivery_key=row["delivery_key"],
        notice_queued=kind == "start" and row["delivery_key"] is not None and agent is not None,
    )
    _done(tx, row, "dispatched", enq.session_id)
    result.routed += 1
    if enq.notice_id is not None:
        result.notice_ids.append(enq.notice_id)


def _holder(pool: Pool, org: str, agent: str | None) -> UUID | None:
    if agent is None:
        return None
    with lend(pool) as conn:
        row = conn.execute(
            query("agent_session_holder"), {"org_id": org, "agent_session_id": agent, "delivered_only": False}
        ).fetchone()
    return None if row is None else UUID(str(row["orchestrator_id"]))


def _done(tx: Tx, row: dict[str, Any], outcome: str, session_id: UUID | None) -> None:
    tx.execute(query("routing_done"), {"id": row["id"], "outcome": outcome, "session_id": session_id})


def _tell(tx: Tx, row: dict[str, Any], message: DispatchPayload, body: str, result: Result) -> None:
    if message.agent_session_id is None:
        return  # a plain assignment: Linear is not told
    nid = notices.write(
        tx,
        org_id=row["org_id"],
        kind="failed",
        session_id=None,
        agent_session_id=message.agent_session_id,
        issue_id=message.issue.id,
        body=body,
    )
    if nid is not None:
        result.notice_ids.append(nid)


def _failed(
    pool: Pool, settings: Settings, row: dict[str, Any], message: DispatchPayload, error: str, result: Result
) -> None:
    """The read failed: due again after the backoff; past the attempt limit, given up and Linear
    told, in one transaction."""
    log.warning('{"event":"routing_failed","routeId":"%s","attempt":%d}', row["id"], row["attempts"])
    with transaction(pool) as tx:
        gave_up = tx.one(
            query("routing_failed"), {"id": row["id"], "error": error, **settings.retry_params()}
        )
        if gave_up is not None and gave_up["gave_up"]:
            _tell(tx, row, message, GAVE_UP.format(error=error), result)
            return
    result.retried += 1
