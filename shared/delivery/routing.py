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

The same table and steps route a start by repository (`need` 'repository', the user known): when
the user's machines differ in what they have, the webhook's transaction writes a request, and this
step asks Linear which repository the issue needs (`shared.delivery.repository_choice`) and queues the start
for the machine that has it, or asks the person (Linear's `select`), whose answer (`answer`, in the
intake transaction of their `prompted`) makes the request due again. A machine that gets a
repository it does not have gives the start back (`release_elsewhere`), and it is routed again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from shared.delivery import queue, repository_choice
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import MachineRevoked, Released, enqueue_dispatch, release_to_route_again
from shared.delivery.repository_choice import Choice
from shared.fleet import machines
from shared.linear import api as linear_api
from shared.linear import notices, pace
from shared.plumbing.db import Pool, Tx, lend, require_tx, take_in_rounds, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.wire.messages import DEFAULT_HOST, Repository, repository_key

log = logging.getLogger("devpilot.routing")

ASSIGNEE = """query DevpilotIssueAssignee($id: String!) {
  issue(id: $id) { id assignee { id name } labels(first: 50) { nodes { name } } }
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
    tx: Tx,
    *,
    org_id: str,
    message: DispatchPayload,
    delivery_key: str | None,
    need: str = "assignee",
    linear_user_id: str | None = None,
) -> UUID:
    """In the webhook's transaction: route `message` after commit, once Linear says what is needed
    (`assignee`: whose machine; `repository`: which of `linear_user_id`'s machines)."""
    tx = require_tx(tx, "routing.request")
    row = tx.one(
        query("routing_request_insert"),
        {
            "org_id": org_id,
            "agent_session_id": message.agent_session_id,
            "issue_id": message.issue.id,
            "need": need,
            "message": Jsonb(message.wire()),
            "delivery_key": delivery_key,
            "linear_user_id": linear_user_id,
        },
    )
    assert row is not None
    return UUID(str(row["id"]))


def cancel(tx: Tx, stops: Jsonb) -> None:
    """In a transaction of stops, after their `take_turns`: each agent session's open requests are
    done, if that statement recorded its delivery (`stops`: the batch of
    `shared.delivery.queue.stop_element`s). Sent, not waited for: in a pipeline
    (`shared.plumbing.db.together`) it goes with the stops' next statements."""
    require_tx(tx, "routing.cancel").execute(query("routing_cancel_agent_session"), {"batch": stops})


def release_elsewhere(
    pool: Pool, orchestrator_id: UUID, queue_id: UUID, claim_token: UUID, reason: str
) -> tuple[Released, list[UUID]] | None:
    """A start given back by a machine that does not have the repository it names: in one
    transaction, the claim ends, the start (and the messages queued behind it) are cancelled on that
    machine, the machine no longer counts as having the repository, and each message gets a routing
    request, in order, routed after the commit (the start to a machine that has the repository, or
    by asking Linear again; its follow-ups to wherever it goes). None, having written nothing: the
    token holds no live claim of a start of this machine (the caller then releases as usual)."""
    with transaction(pool) as tx:
        given_back = release_to_route_again(
            tx, orchestrator_id, queue_id, claim_token, f"given back by its machine: {reason}"[:2000]
        )
        if given_back is None:
            return None
        start = given_back[0][0]
        if start.repository is not None:
            machines.forget(
                tx,
                orchestrator_id,
                repository_key(start.repository.hostname, start.repository.full_name),
            )
        org = _org_of(tx, orchestrator_id)
        ids = [
            request(
                tx,
                org_id=org,
                message=message,
                delivery_key=None,
                need="repository" if user else "assignee",
                linear_user_id=user,
            )
            for message, user in given_back
        ]
    return Released("released", None, rerouted=True), ids


def _org_of(tx: Tx, orchestrator_id: UUID) -> str:
    row = tx.one(query("orchestrator_org"), {"id": orchestrator_id})
    assert row is not None
    return str(row["org_id"])


@dataclass
class Result:
    routed: int = 0
    retried: int = 0
    asked: int = 0
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
    message = DispatchPayload.from_wire(row["message"])
    org = row["org_id"]
    user: str | None = row.get("linear_user_id")
    outcome: str | None = None
    choice: Choice | None = None
    if _holder(pool, org, message.agent_session_id) is None:  # else: no need to ask Linear
        labels: list[str] | None = None
        if row["need"] == "assignee":
            try:
                data = linear_api.graphql(pool, settings, org, ASSIGNEE, {"id": row["issue_id"]})
                issue = (data.get("issue") or {}) if isinstance(data, dict) else {}
                person = issue.get("assignee") or {}
                user = person.get("id") if isinstance(person.get("id"), str) else None
                labels = repository_choice.labels_of(issue)
                outcome = None if user else "no_assignee"
            except linear_api.NotConnected:
                outcome = "not_connected"
            except linear_api.RateLimited as exc:  # not an attempt: due again after the org's wait
                with lend(pool) as conn:
                    conn.execute(
                        query("routing_ratelimited"),
                        {"id": row["id"], "error": str(exc)[:300], **pace.params(org, exc)},
                    )
                return
            except linear_api.Unavailable as exc:
                _failed(pool, settings, row, message, str(exc), result)
                return
        if user is not None:  # which of the user's machines: by repository, when they differ
            choice = repository_choice.choose(pool, settings, row, message, user, labels)
    for attempt in range(ROUNDS):
        try:
            with transaction(pool) as tx:
                _decide(tx, row, message, user, outcome, choice, result)
            return
        except MachineRevoked:
            if attempt == ROUNDS - 1:  # (each round needs a revoke committed during it)
                _failed(pool, settings, row, message, "its machines kept changing", result)


def _decide(
    tx: Tx,
    row: dict[str, Any],
    message: DispatchPayload,
    user: str | None,
    outcome: str | None,
    choice: Choice | None,
    result: Result,
) -> None:
    """In one transaction, after the agent session's turn: queue the message (to the machine that
    holds the agent session, or the user's machine `choice` picks), ask the person which
    repository, or tell Linear why nothing can take it; the request done with it (or asked).
    Nothing, if a stop cancelled the request meanwhile."""
    org, agent = row["org_id"], message.agent_session_id
    tx.execute(query("agent_session_turn_alone"), {"org_id": org, "agent_session_id": agent})
    if tx.one(query("routing_lock_open"), {"id": row["id"]}) is None:
        return  # done meanwhile (a stop cancelled it)
    holder = tx.one(
        query("agent_session_holder"), {"org_id": org, "agent_session_id": agent, "delivered_only": False}
    )
    machine: UUID | None = None
    kind = message.kind
    repository: Repository | None = None
    note: str | None = None
    name = ""
    if holder is not None:  # the conversation has a machine: the message follows it, never re-routed
        machine, kind = holder["orchestrator_id"], ("prompt" if message.kind != "stop" else "stop")
    elif user is not None and choice is not None and choice.ask is not None:
        _ask(tx, row, choice, result)
        return
    elif user is not None:
        picked, repository, note = _machine_for(tx, org, user, choice)
        machine, kind = (picked["id"] if picked else None), "start"
        name = picked["name"] if picked else ""
        outcome = None if picked else "no_machine"
    if machine is None:
        body = {
            "no_assignee": NO_ASSIGNEE,
            "not_connected": NOT_CONNECTED,
            "no_machine": "No machine is registered in devpilot for "
            + ("the issue's assignee" if row["need"] == "assignee" else "the person who started this")
            + "; nothing was dispatched.",
        }[outcome or "no_machine"]
        _done(tx, row, outcome or "no_machine", None)
        _tell(tx, row, message, body, result)
        return
    payload = replace(message, kind=kind, repository=repository if kind == "start" else None)
    chosen = choice is not None and not choice.alike
    enq = enqueue_dispatch(
        tx,
        org_id=org,
        orchestrator_id=machine,
        linear_user_id=user,
        message=payload,
        delivery_key=row["delivery_key"],
        notice_queued=kind == "start"
        and row["delivery_key"] is not None
        and agent is not None
        and not chosen,
    )
    _done(tx, row, "dispatched", enq.session_id)
    result.routed += 1
    if enq.notice_id is not None:
        result.notice_ids.append(enq.notice_id)
    if kind == "start" and chosen:
        if note:
            queue.note_routing(tx, enq.session_id, note)
        if agent is not None:  # Linear's first activity says where, and why there
            said = f"Queued for {name}" + (
                f" — {note}" if note else f" ({_short(repository)})" if repository is not None else ""
            )
            nid = notices.write(
                tx,
                org_id=org,
                kind="dispatched",
                session_id=enq.session_id,
                agent_session_id=agent,
                issue_id=message.issue.id,
                body=said,
            )
            if nid is not None:
                result.notice_ids.append(nid)


def _machine_for(
    tx: Tx, org: str, user: str, choice: Choice | None
) -> tuple[Any, Repository | None, str | None]:
    """In the routing transaction: the user's most recently seen active machine among the choice's
    candidates that has its repository; when none has it any more (a machine revoked or changed
    since Linear was asked), the most recently seen machine, as before, and the note says so."""
    repository = choice.repository if choice is not None else None
    note = choice.note if choice is not None else None
    params = {
        "org_id": org,
        "route_user": user,
        "ids": choice.machines if choice is not None else None,
        "repository": repository_key(repository.hostname, repository.full_name) if repository else None,
    }
    picked = tx.one(query("repository_machine"), params)
    if picked is None and (params["ids"] is not None or repository is not None):
        picked = tx.one(query("repository_machine"), {**params, "ids": None, "repository": None})
        if picked is not None:
            gone = (
                f"no machine of yours has {_short(repository)} now" if repository else "its machines changed"
            )
            note, repository = (
                f"{note + '; ' if note else ''}{gone}: routed to the most recently seen machine",
                None,
            )
    return picked, repository, note


def _ask(tx: Tx, row: dict[str, Any], choice: Choice, result: Result) -> None:
    """In the routing transaction: ask the person which repository (Linear's `select`); the request
    waits, open, for their answer."""
    nid = tx.one(
        query("routing_ask"),
        {
            "id": row["id"],
            "candidates": Jsonb(choice.stored()),
            "body": choice.question,
            "options": Jsonb(choice.options()),
        },
    )
    result.asked += 1
    if nid is not None:
        result.notice_ids.append(nid["id"])


def _short(r: Repository | None) -> str:
    if r is None:
        return ""
    return r.full_name if r.hostname == DEFAULT_HOST else f"{r.hostname}/{r.full_name}"


def _holder(pool: Pool, org: str, agent: str | None) -> UUID | None:
    """A hint, outside the turn: the machine that holds the agent session, so Linear need not be
    asked. None also while another transaction has the agent session's turn (the holder is read
    only with the turn: `devpilot_agent_session_holder`); `_decide` reads it again under the turn."""
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
