"""The dispatch queue: the table is the delivery guarantee; this module is every write to it.

The states of a queue row, and which statement moves a row out of each, are listed at the top of
`shared/queries/queue.sql`, beside the statements themselves. In short: AVAILABLE --claim-->
CLAIMED --ack--> deleted (session delivered); CLAIMED --release/sweep--> AVAILABLE after
min(n² × base, cap), or deleted with the session failed at the attempt limit; AVAILABLE or CLAIMED
--cancel--> deleted (session cancelled).

Every write after the claim is a compare-and-set on the token and state it expects; zero rows
changed means another party won, and the caller is told so instead of overwriting. Session state
mirrors the row: a session is `queued` exactly while its row exists, and the database enforces
that at every commit (a deferred constraint trigger, migration 0001).

These functions are the transaction level: each returns what its transaction wrote for after the
commit (Linear notice ids); `shared.dispatch` is the service level that sends them.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple
from uuid import UUID, uuid4

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from shared.delivery.models import DispatchPayload, Enqueued, with_request
from shared.fleet import orchestrators
from shared.fleet.orchestrators import Orchestrator
from shared.plumbing.batching import firsts
from shared.plumbing.db import Conn, Pool, Tx, lend, require_tx, statement, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query, query_with_limit
from shared.wire.messages import MessageKind, TaskDispatchMessage

AckStatus = Literal["acked", "claim_superseded", "not_found"]

NOTIFY_CHANNEL = "devpilot_dispatch"  # the channel `enqueue` notifies and the `listen` query joins
SWEEP_BATCH = 1000
# Starts moved off quiet machines per transaction: each agent session's start holds its turn (an
# advisory lock, in the server's shared lock table) until the commit, so a batch takes fewer.
REROUTE_BATCH = 100
SWEEP_RUNS_KEPT = 20_160  # `record_sweep`: a week of sweeps every 30 s


class IssueOvertaken(Exception):
    """Every round of an issue's assignment event found a dispatch of the issue committed while it
    waited for the issue's turn, too late for its statement to cancel: nothing was written for it."""


class MachineRevoked(Exception):
    """The machine chosen for a message is revoked (or gone): nothing was written for it. The
    caller's transaction cannot commit the decision it made before; it rolls back and decides again
    (the revoke has committed by now, so a new look no longer chooses that machine)."""


def enqueue_dispatch(
    tx: Tx,
    *,
    org_id: str,
    orchestrator_id: UUID,
    linear_user_id: str | None,
    message: DispatchPayload,
    session_id: UUID | None = None,
    now: datetime | None = None,
    delivery_key: str | None = None,
    notice_queued: bool = False,
    speaks_as: str | None = None,
) -> Enqueued:
    """Create a `queued` session and queue its message for the orchestrator, in one statement of
    the caller's transaction. `tx` is required and must be open: there is no way to write a session
    outside a transaction that also writes its queue row, so "session committed but nothing
    dispatched" cannot be written. The session's issue, agent session and kind are the message's.
    The wake-up NOTIFY is sent by the same statement and delivered by Postgres only on commit.
    Raises MachineRevoked, having written nothing, when the machine is not active (its revoke may
    have committed while this statement waited for it). `delivery_key`: the webhook delivery this
    message answers (the intake's), recorded as dispatched to the new session by the same statement;
    with it, `notice_queued` (an agent session's start) also writes Linear's "Queued for <machine>"
    notice in that statement, for an org Linear is told about (`Enqueued.notice_id`). `speaks_as`:
    the agent session's name in the message the machine gets, when the machine knows it by another
    (the alias of an agent session devpilot opened for a plain assignment); the queue's order and
    the session stay the agent session's."""
    tx = require_tx(tx, "enqueue_dispatch")
    if not isinstance(message, DispatchPayload):
        raise TypeError("enqueue_dispatch() message must be a DispatchPayload")
    if notice_queued and (
        delivery_key is None or message.agent_session_id is None or message.kind != "start"
    ):
        raise ValueError("notice_queued is for an agent session's start answering a webhook delivery")
    if delivery_key is None:
        name = "enqueue"
    elif notice_queued:
        name = "enqueue_start_for_delivery"
    else:
        name = "enqueue_for_delivery"
    params = _session_params(message, session_id, now)
    if speaks_as is not None:
        payload = replace(message, agent_session_id=speaks_as)
        params["payload"] = Jsonb(payload.wire())
    row = tx.one(
        query(name),
        {
            **params,
            "org_id": org_id,
            "orchestrator_id": orchestrator_id,
            "linear_user_id": linear_user_id,
            "delivery_key": delivery_key,
            "notice_queued": notice_queued,
        },
    )
    if row is None:
        raise MachineRevoked(f"orchestrator {orchestrator_id} is not active")
    return Enqueued(
        session_id=row["session_id"],
        queue_id=row["queue_id"],
        message_id=row["message_id"],
        notice_id=row.get("notice_id"),
    )


def _session_params(
    message: DispatchPayload, session_id: UUID | None, now: datetime | None
) -> dict[str, Any]:
    """The new session's and its queue row's values that come from the message
    (`enqueue_session_rows` in queue.sql)."""
    return {
        "session_id": session_id or uuid4(),
        "issue_id": message.issue.id,
        "issue_identifier": message.issue.identifier,
        "agent_session_id": message.agent_session_id,
        "kind": message.kind,
        "payload": Jsonb(message.wire()),
        "now": now,
    }


# The records here are NamedTuples, cheap to define at import (docs/design.md, cold start). Being
# tuples, one sent whole to SQL or JSON would go as a record or an array: send its fields.
class Routed(NamedTuple):
    """What `route_and_enqueue` (or `follow_ups`) queued (`enqueued`), and for which machine; `kind`:
    an agent session's message says which (None: an issue's start)."""

    enqueued: Enqueued
    orchestrator_id: UUID
    kind: MessageKind | None = None


class Asked(NamedTuple):
    """An issue's start for a user whose machines differ in what they have: its routing request
    (which of them has the issue's repository is asked of Linear after the commit)."""

    route_id: UUID


class Ignored(NamedTuple):
    """An agent session's start recorded as ignored: `reason` (`no_orchestrator`: the user has no
    machine, and `notice_id` is Linear's `error` saying so, if the org is told; or
    `agent_session_started` / `agent_session_stopped`: it may no longer start)."""

    reason: str
    notice_id: UUID | None


# The `error` Linear gets for an agent session that no machine can take.
UNROUTABLE: Final = (
    "No machine is registered in devpilot for the person who started this; nothing was dispatched."
)
NO_MACHINE: Final = "no_machine"  # `route_and_enqueue` recorded a plain issue's delivery as ignored
SUPERSEDED: Final = "superseded"  # recorded as ignored: a later assignment change of the issue was handled
REVOKED: Final = "revoked"  # nothing written: the machine chosen was revoked meanwhile (write it again)
# Nothing written: a dispatch of the issue, to cancel, was committed while the statement waited for
# the issue's turn, too late for its snapshot (write it again: the next statement sees it).
OVERTAKEN: Final = "overtaken"
RouteOutcome = Routed | Asked | Ignored | Literal["no_machine", "superseded", "overtaken", "revoked"] | None


class Start(NamedTuple):
    """A start as one webhook asks for it (`route_and_enqueue`, `route_and_enqueue_many`): the org,
    the Linear user, the message, the delivery's two keys. An agent session's has nothing to cancel
    first; an issue's is an assignment (`IssueChange`): its undelivered dispatch is cancelled."""

    org_id: str
    linear_user_id: str
    message: DispatchPayload
    delivery_key: str
    content_key: str
    # An issue's: when Linear made the assignment (`Intent.event_at`); written nothing for when a
    # later change of the issue was handled. None orders against nothing.
    event_at: datetime | None = None


def route_and_enqueue(
    tx: Tx,
    *,
    org_id: str,
    linear_user_id: str,
    message: DispatchPayload,
    delivery_key: str,
    content_key: str,
    session_id: UUID | None = None,
    now: datetime | None = None,
    event_at: datetime | None = None,
) -> RouteOutcome:
    """The webhook intake of a start (an issue created with an assignee or assigned with nobody
    before, an agent session `created` by a person) in one statement, `route_and_enqueue_many` of
    one: the delivery recorded (its two keys), the issue's or the agent session's turn taken,
    waiting, the user's machine chosen by the routing policy and the message queued for it as
    `enqueue_dispatch` does, with Linear's "Queued for" notice for an agent session
    (`Enqueued.notice_id`). `tx` is required, as for every write to the queue; a
    `shared.plumbing.db.statement()` makes the statement its own transaction (one round trip in
    all).

    The statement decides the start whole: dispatched (`Routed`); a user whose machines differ
    (`Asked`: the routing request written); no machine (`NO_MACHINE` for an issue, Linear not
    told; `Ignored` for an agent session, with Linear's `error`); an issue's assignment older than
    a change of it handled already (`SUPERSEDED`), an agent session already started or stopped
    (`Ignored`), both recorded; and, nothing written: the machine chosen revoked meanwhile
    (`REVOKED`: write it again), a dispatch of the issue committed too late for the statement's
    snapshot to cancel (`OVERTAKEN`: write it again), or the delivery seen before (None). An
    issue's start cancels the issue's undelivered assignment dispatch first (`change_issues`)."""
    tx = require_tx(tx, "route_and_enqueue")
    if not isinstance(message, DispatchPayload):
        raise TypeError("route_and_enqueue() message must be a DispatchPayload")
    if message.kind != "start":
        raise ValueError("route_and_enqueue is for a start")
    start = Start(org_id, linear_user_id, message, delivery_key, content_key, event_at)
    return _route_and_enqueue_many(tx, [start], session_id, now)[0]


class FollowUp(NamedTuple):
    """A follow-up as one `prompted` webhook asks for it (`follow_ups`): the org, the Linear user
    who wrote it (None: an agent session an automation started), the `prompt` message (its issue
    the webhook's; with `issue_given` False, the webhook named none), the delivery's two keys."""

    org_id: str
    linear_user_id: str | None
    message: DispatchPayload
    delivery_key: str
    content_key: str
    written_at: datetime | None = None  # when the person wrote it (Linear's time; None: unknown)
    picked: str | None = None  # a `select` signal's choice: maybe the answer to a repository question
    issue_given: bool = True


def follow_ups(tx: Tx, follow_ups: list[FollowUp], now: datetime | None = None) -> list[RouteOutcome]:
    """The webhook intake of follow-ups (`prompted`, the `select` signal's answers among them), one
    or several, in one statement (`follow_ups_for_delivery`) that waits for each agent session's
    turn, in the order of the turns' keys, and decides each whole with reads taken after it: all of
    them committed together. `tx` is required, as for every write to the queue; a
    `shared.plumbing.db.statement()` makes the statement its own transaction (one round trip).

    Each element's outcome, in order: a `prompt` queued for the machine that holds the agent
    session, or, nobody holding it, a `start` for the writer's machine (`Routed`, its `kind` says
    which); a routing request (`Asked`: behind a start still waiting to be routed, for an agent
    session an automation started, for a writer whose machines differ, or the person's answer to
    the question a request asked); recorded as ignored (`Ignored`: written at or before a stop of
    the agent session, or no machine can take it, Linear told why); the machine revoked meanwhile
    (`REVOKED`, nothing written: write it again); seen before (None: nothing written). A copy of an
    earlier element, or a second element of its agent session, is answered None and not written
    (the caller writes it after the first)."""
    tx = require_tx(tx, "follow_ups")
    for f in follow_ups:
        if f.message.kind != "prompt" or f.message.agent_session_id is None:
            raise ValueError("follow_ups is for agent sessions' prompts")
    written = firsts(
        (f.delivery_key, f.content_key, (f.org_id, f.message.agent_session_id)) for f in follow_ups
    )
    batch = [
        {
            "n": n,
            "org_id": f.org_id,
            "route_user": f.linear_user_id,
            "delivery_key": f.delivery_key,
            "content_key": f.content_key,
            "session_id": str(uuid4()),
            "issue_id": f.message.issue.id if f.issue_given else None,
            "issue_identifier": f.message.issue.identifier,
            "agent_session_id": f.message.agent_session_id,
            "payload": f.message.wire(),
            # (nobody holds the agent session: the conversation starts on the writer's machine)
            "start": replace(f.message, kind="start").wire() if f.issue_given else None,
            "prompt_at": f.written_at.isoformat() if f.written_at is not None else None,
            "picked": f.picked,
        }
        for n, f in enumerate(follow_ups[i] for i in written)
    ]
    rows = tx.all(
        query("follow_ups_for_delivery"), {"batch": Jsonb(batch), "now": now, "unroutable": UNROUTABLE}
    )
    out: list[RouteOutcome] = [None] * len(follow_ups)
    for i, row in zip(written, rows, strict=True):
        out[i] = _followed(row)
    return out


def _followed(row: DictRow) -> RouteOutcome:
    """What a row of `follow_ups_for_delivery` says was written."""
    if row["revoked"]:
        return REVOKED
    if row["outcome"] is None:
        return None
    if row["route_id"] is not None:
        return Asked(row["route_id"])
    if row["outcome"] == "ignored":
        stopped = row["way"] == "stopped"
        return Ignored("agent_session_stopped" if stopped else "no_orchestrator", row["notice_id"])
    enqueued = Enqueued(
        session_id=row["session_id"],
        queue_id=row["queue_id"],
        message_id=row["message_id"],
        notice_id=row["notice_id"],
    )
    kind: MessageKind = "start" if row["kind"] == "start" else "prompt"
    return Routed(enqueued, row["orchestrator_id"], kind)


def _route_outcome(row: DictRow) -> RouteOutcome:
    """What a row of the agent sessions' starts (`route_and_start_agent_sessions_many_for_delivery`)
    says was written."""
    if row["revoked"]:
        return REVOKED
    if row["route_id"] is not None:
        return Asked(row["route_id"])
    if row["outcome"] is None:
        return None
    if row["outcome"] == "ignored":
        reason = f"agent_session_{row['seen']}" if row["seen"] else "no_orchestrator"
        return Ignored(reason, row["notice_id"])
    enqueued = Enqueued(
        session_id=row["session_id"],
        queue_id=row["queue_id"],
        message_id=row["message_id"],
        notice_id=row["notice_id"],
    )
    return Routed(enqueued, row["orchestrator_id"], "start")


def route_and_enqueue_many(tx: Tx, starts: list[Start]) -> list[RouteOutcome]:
    """`route_and_enqueue` for several starts of one kind in one statement (its own transaction,
    given by `shared.plumbing.db.statement()`): issues' starts (`change_issues`), or
    agent sessions `created` (`route_and_start_agent_sessions_many_for_delivery`). Each element's
    outcome is what `route_and_enqueue` would answer it alone, in order, and all of them commit
    together. A copy of an earlier element (its delivery key or content key again), or a second
    element of the same issue or agent session, is not written: it is answered None (the caller
    writes it after the first: a copy then finds the first one's record, `duplicate`). Each
    element's turn is waited for, every turn of the batch in the order of the turns' keys."""
    tx = require_tx(tx, "route_and_enqueue_many")
    return _route_and_enqueue_many(tx, starts, None, None)


def _route_and_enqueue_many(
    tx: Tx, starts: list[Start], session_id: UUID | None, now: datetime | None
) -> list[RouteOutcome]:
    if any(st.message.kind != "start" for st in starts):
        raise ValueError("route_and_enqueue_many is for starts")
    agent = [st.message.agent_session_id is not None for st in starts]
    if any(agent) and not all(agent):
        raise ValueError("route_and_enqueue_many takes issues' starts or agent sessions' starts, not both")
    if starts and not agent[0]:  # (an issue's start is its assignment: `change_issues`)
        changes = [
            IssueChange(
                st.org_id,
                st.message.issue.id,
                st.delivery_key,
                st.content_key,
                st.event_at,
                ASSIGNED,
                st.linear_user_id,
                st.message,
            )
            for st in starts
        ]
        return [_start_of(o) for o in _change_issues(tx, changes, session_id, now)]
    # (A turn is re-entrant within the transaction: two elements of one agent session would both
    # have it, and neither would see the other's dispatch.)
    written = firsts(
        (st.delivery_key, st.content_key, (st.org_id, st.message.agent_session_id)) for st in starts
    )
    # The batch as one JSON document (`jsonb_to_recordset`): psycopg dumps it with the standard
    # library's C encoder, where each array of text would be escaped element by element in Python
    # (bench/README.md, "What was tried").
    batch = [
        {
            "n": n,
            "org_id": st.org_id,
            "route_user": st.linear_user_id,
            "delivery_key": st.delivery_key,
            "content_key": st.content_key,
            "session_id": str(session_id or uuid4()),
            "issue_id": st.message.issue.id,
            "issue_identifier": st.message.issue.identifier,
            "agent_session_id": st.message.agent_session_id,
            "payload": st.message.wire(),
        }
        for n, st in enumerate(starts[i] for i in written)
    ]
    rows = tx.all(
        query("route_and_start_agent_sessions_many_for_delivery"),
        {"batch": Jsonb(batch), "now": now, "unroutable": UNROUTABLE},
    )
    out: list[RouteOutcome] = [None] * len(starts)
    for i, row in zip(written, rows, strict=True):
        out[i] = _route_outcome(row)
    return out


ASSIGNED: Final = "issue assigned: assignment changed"  # (a library caller's start: why it cancels)


class IssueChange(NamedTuple):
    """An issue's assignment event as one webhook asks for it (`change_issues`): the issue's
    undelivered assignment dispatch cancelled (`reason`, the cancelled session's), and a start for
    `user`'s machine (`message`; `user` None: the cancel alone, an issue unassigned or removed).
    `event_at`: when Linear made the change (None orders against nothing)."""

    org_id: str
    issue_id: str
    delivery_key: str
    content_key: str
    event_at: datetime | None
    reason: str
    user: str | None = None
    message: DispatchPayload | None = None


class IssueChanged(NamedTuple):
    """What an issue's assignment event wrote (`change_issues`): the start's outcome (`Routed`,
    `Asked`, `NO_MACHINE`; None for a cancel alone), and the first session it cancelled (None:
    nothing was undelivered)."""

    start: RouteOutcome
    cancelled: UUID | None


# Recorded as ignored (`SUPERSEDED`); nothing written (`REVOKED`, `OVERTAKEN`: write it again;
# None: the delivery was seen before).
IssueOutcome = IssueChanged | Literal["superseded", "revoked", "overtaken"] | None


def change_issues(tx: Tx, changes: list[IssueChange]) -> list[IssueOutcome]:
    """The webhook intake of issues' assignment events (created with an assignee, assigned,
    re-assigned, unassigned, removed) in one statement (`issue_changes_for_delivery`; its own
    transaction, given by `shared.plumbing.db.statement()`): each waits for its issue's turn, every
    turn of the batch in the order of the turns' keys, then cancels the issue's undelivered
    assignment dispatch and queues the start, with the delivery's record of what it did. One
    outcome per change, in order. A copy of an earlier element (its delivery key or content key
    again), or a second change of the same issue, is not written: it is answered None (the caller
    writes it after the first: a copy then finds the first one's record, `duplicate`)."""
    tx = require_tx(tx, "change_issues")
    return _change_issues(tx, changes, None, None)


def _change_issues(
    tx: Tx, changes: list[IssueChange], session_id: UUID | None, now: datetime | None
) -> list[IssueOutcome]:
    if any(
        c.message is not None and (c.message.kind != "start" or c.message.agent_session_id) for c in changes
    ):
        raise ValueError("change_issues starts issues")
    # (A turn is re-entrant within the transaction: two elements of one issue would both have it,
    # and neither would see the other's dispatch.)
    written = firsts((c.delivery_key, c.content_key, (c.org_id, c.issue_id)) for c in changes)
    batch = [
        {
            "n": n,
            "org_id": c.org_id,
            "route_user": c.user if c.message is not None else None,
            "delivery_key": c.delivery_key,
            "content_key": c.content_key,
            "session_id": str(session_id or uuid4()),
            "issue_id": c.issue_id,
            "issue_identifier": c.message.issue.identifier if c.message is not None else None,
            "event_at": c.event_at.isoformat() if c.event_at is not None else None,
            "payload": c.message.wire() if c.message is not None else None,
            "reason": c.reason,
        }
        for n, c in enumerate(changes[i] for i in written)
    ]
    rows = tx.all(query("issue_changes_for_delivery"), {"batch": Jsonb(batch), "now": now})
    out: list[IssueOutcome] = [None] * len(changes)
    for i, row in zip(written, rows, strict=True):
        out[i] = _issue_outcome(row, changes[i].message is not None)
    return out


def _issue_outcome(row: DictRow, starts: bool) -> IssueOutcome:
    """What a row of `issue_changes_for_delivery` says was written."""
    if row["overtaken"]:
        return OVERTAKEN
    if row["revoked"]:
        return REVOKED
    if row["outcome"] is None:
        return None
    if row["superseded"]:
        return SUPERSEDED
    start: RouteOutcome = None
    if row["route_id"] is not None:
        start = Asked(row["route_id"])
    elif row["outcome"] == "dispatched":
        enqueued = Enqueued(
            session_id=row["session_id"], queue_id=row["queue_id"], message_id=row["message_id"]
        )
        start = Routed(enqueued, row["orchestrator_id"])
    elif starts:
        start = NO_MACHINE
    return IssueChanged(start, row["cancelled"])


def _start_of(outcome: IssueOutcome) -> RouteOutcome:
    """An issue's start's outcome (`route_and_enqueue_many`) from its assignment's."""
    return outcome.start if isinstance(outcome, IssueChanged) else outcome


def claim(
    pool: Pool,
    orchestrator_id: UUID,
    *,
    max: int,
    lease_seconds: int,
    now: datetime | None = None,
    handover_seconds: int | None = None,
) -> list[TaskDispatchMessage]:
    """Claim up to `max` due rows of this orchestrator, oldest due first. Exactly-once under any
    number of concurrent claimers: one statement locks with SKIP LOCKED and sets a fresh claim token
    and lease on the rows it returns, so no row is handed out twice while its lease holds.

    With `handover_seconds` (a long-poll woken by new work, whose client may be gone): the rows are
    handed over instead (`claim_handover` in queue.sql): a fresh token, due again after that many
    seconds unless acked, the attempt not counted."""
    _check_max(max)
    params = {
        "orchestrator_id": orchestrator_id,
        "max": max,
        "lease_seconds": lease_seconds,
        "now": now,
        "handover_seconds": handover_seconds,
    }
    # One statement on an autocommit connection is its own transaction: the same atomicity as a
    # BEGIN/COMMIT block, in one round trip instead of three. Its LIMIT written in, so that it is
    # not planned at every execution (`query_with_limit`).
    statement = query_with_limit("claim" if handover_seconds is None else "claim_handover", max)
    with lend(pool) as conn:
        rows = conn.execute(statement, params).fetchall()
    return _messages(rows)


def poll(
    pool: Pool, token_hash: bytes, *, max: int, lease_seconds: int, now: datetime | None = None
) -> tuple[Orchestrator, list[TaskDispatchMessage]] | None:
    """The poll route in one statement (`poll` in queue.sql): the active machine holding this token
    hash, marked seen, and `claim` for it. None when the hash is no active machine's (nothing is
    claimed then). The same exactly-once claim as `claim`; one round trip for an idle machine's poll."""
    _check_max(max)
    params = {"token_hash": token_hash, "max": max, "lease_seconds": lease_seconds, "now": now}
    with lend(pool) as conn:  # one statement, autocommit: its own transaction (LIMIT written in, as `claim`)
        rows = conn.execute(query_with_limit("poll", max), params).fetchall()
    if not rows:
        return None
    return _caller(rows[0]), _messages([r for r in rows if r["id"] is not None])


def _caller(row: DictRow) -> Orchestrator:
    """The machine a one-statement route (`poll`, `ack_as`) found for its token (the `caller_*` columns)."""
    return Orchestrator(row["caller_id"], row["caller_org_id"], row["caller_user_id"], row["caller_name"])


def _check_max(max: int) -> None:
    if not 1 <= max <= 1000:
        raise ValueError("max must be between 1 and 1000")


def _messages(rows: list[DictRow]) -> list[TaskDispatchMessage]:
    rows.sort(key=lambda r: (r["available_at"], r["id"]))
    return [_message(r, DispatchPayload.from_wire(r["payload"])) for r in rows]


def _message(r: DictRow, payload: DispatchPayload) -> TaskDispatchMessage:
    """A claimed row as its machine receives it: the claim's fields, and the payload stored with it."""
    return TaskDispatchMessage(
        message_id=r["message_id"],
        queue_id=r["id"],
        session_id=r["session_id"],
        org_id=r["org_id"],
        orchestrator_id=r["orchestrator_id"],
        attempt=r["attempts"],
        claim_token=r["claim_token"],
        lease_expires_at=r["lease_expires_at"],
        created_at=r["created_at"],
        issue=payload.issue,
        agent_session_id=payload.agent_session_id,
        kind=payload.kind,
        prompt=with_request(payload.kind, payload.issue, payload.prompt),
        repository=payload.repository,
    )


class AckItem(NamedTuple):
    queue_id: UUID
    claim_token: UUID


# What an ack that missed is told. Only the latest claim's token is kept, so a token that is not it
# may be an older claim's or one never issued for the row: the service cannot tell which, and says
# so, except where no claim was ever made.
NOT_CLAIMED = (
    "nothing has claimed this row yet, so no claim token was issued for it: ack with the claimToken "
    "its claim returns"
)
NOT_LATEST = (
    "this claimToken is not the row's latest claim's: it is an older claim's, superseded, or was never "
    "issued for this row; drop this copy"
)
DELIVERED_BY_ANOTHER = (
    "this row was delivered, acked with another claim's token: this claimToken is an older claim's "
    "or one never issued for it; drop this copy"
)
NOT_FOUND = "no such queue row for this orchestrator"


def _explain_miss(conn: Conn, orchestrator_id: UUID, item: AckItem) -> tuple[AckStatus, str]:
    """After the compare-and-set missed: a repeat of a successful ack, a superseded token, or none;
    and what the caller is told."""
    params = {"queue_id": item.queue_id, "orchestrator_id": orchestrator_id}
    miss = conn.execute(query("ack_explain_miss"), params).fetchone()
    assert miss is not None
    if miss["session_status"] == "delivered":
        if miss["acked_token"] == item.claim_token:
            return "acked", ""
        return "claim_superseded", DELIVERED_BY_ANOTHER
    if miss["session_status"] == "queued":  # the row is there (the invariant); not its latest claim's
        return "claim_superseded", NOT_CLAIMED if miss["live_token"] is None else NOT_LATEST
    return "not_found", NOT_FOUND


class AckResult(NamedTuple):
    statuses: list[AckStatus]
    notice_ids: list[UUID]  # the `delivered` Linear notices the same statement wrote
    details: list[str]  # for each item, what it is told ("" when acked)


def ack_many(
    pool: Pool, orchestrator_id: UUID, items: list[AckItem], public_url: str | None = None
) -> AckResult:
    """Deliver: delete each row and mark its session `delivered`, only if the token is the row's
    latest claim. Every write is in one statement (autocommit, so one transaction); only items that
    missed are then explained, read-only. Repeating a successful ack answers `acked` again.
    `public_url` (DEVPILOT_PUBLIC_URL): the base of the session pages Linear links to."""
    params = {"orchestrator_id": orchestrator_id, **_ack_params(items, public_url)}  # (checked first)
    with lend(pool) as conn:
        rows = conn.execute(query("ack"), params).fetchall()
        return _ack_result(conn, orchestrator_id, items, rows)


def ack_as(
    pool: Pool, token_hash: bytes, items: list[AckItem], public_url: str | None = None
) -> tuple[Orchestrator, AckResult] | None:
    """The ack route in one statement (`ack_as` in queue.sql): the active machine holding this token
    hash, marked seen, and `ack_many`'s work for it. None when the hash is no active machine's
    (nothing is acked then). One round trip for an ack that lands."""
    params = {"token_hash": token_hash, **_ack_params(items, public_url)}  # (checked first)
    with lend(pool) as conn:
        rows = conn.execute(query("ack_as"), params).fetchall()
        if not rows:
            return None
        caller = _caller(rows[0])
        return caller, _ack_result(conn, caller.id, items, [r for r in rows if r["queue_id"] is not None])


def _ack_params(items: list[AckItem], public_url: str | None) -> dict[str, Any]:
    return {
        "queue_ids": _uuid_array([i.queue_id for i in items]),
        "claim_tokens": _uuid_array([i.claim_token for i in items]),
        "public_url": public_url.rstrip("/") if public_url else None,
    }


def _uuid_array(ids: list[UUID]) -> str:
    """A `uuid[]` as its text, which the statement casts: psycopg dumps a list of UUIDs one element
    at a time in Python, several times the cost of joining their text (bench/README, "Claim + ack
    against PgQueuer"). Only UUIDs: the text of anything else could read as more than one element."""
    for i in ids:
        if not isinstance(i, UUID):
            raise TypeError(f"not a UUID: {type(i).__name__}")
    return "{" + ",".join([i.hex for i in ids]) + "}"  # (32 hex digits: Postgres reads them as a uuid)


def _ack_result(conn: Conn, orchestrator_id: UUID, items: list[AckItem], rows: list[DictRow]) -> AckResult:
    acked = {(r["queue_id"], r["claim_token"]) for r in rows}
    # An item listed twice is deleted once; its second copy is then judged a repeated ack.
    judged: list[tuple[AckStatus, str]] = [
        ("acked", "") if (i.queue_id, i.claim_token) in acked else _explain_miss(conn, orchestrator_id, i)
        for i in items
    ]
    statuses: list[AckStatus] = [status for status, _ in judged]
    notices = list(rows[0]["notice_ids"] or []) if rows else []
    return AckResult(statuses, notices, [detail for _, detail in judged])


def ack(pool: Pool, orchestrator_id: UUID, queue_id: UUID, claim_token: UUID) -> AckStatus:
    """The single form: judged exactly as one item of the batch form."""
    return ack_many(pool, orchestrator_id, [AckItem(queue_id, claim_token)]).statuses[0]


def wait_for_turn(tx: Tx, peek: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """Run the statement `peek`, which reads a row's agent session (`org_id`, `agent_session_id`)
    or finds no row, and then wait for that agent session's turn, held to the commit: what the
    caller's next statements read is what the turn's previous holder committed. The row read, or
    None (no turn taken)."""
    tx = require_tx(tx, "wait_for_turn")
    row = tx.one(query(peek), params)
    if row is None:
        return None
    tx.execute(query("agent_session_turn_alone"), dict(row))
    return dict(row)


class Released(NamedTuple):
    status: Literal["released", "claim_superseded", "not_found"]
    available_at: datetime | None = None
    dead_lettered: bool = False
    notice_ids: tuple[UUID, ...] = ()
    rerouted: bool = False  # given back to be routed again (`release_to_route_again`)


def end_claim_params(settings: Settings, now: datetime | None = None) -> dict[str, Any]:
    """The parameters of `end_claims` (queue.sql), which the release and the sweep share: the
    attempt limit and the backoff `min(n² × base, cap)`, and the clock (None: the database's)."""
    return {"now": now, **settings.retry_params()}


def release(
    pool: Pool,
    settings: Settings,
    orchestrator_id: UUID,
    queue_id: UUID,
    claim_token: UUID,
    *,
    reason: str | None = None,
    now: datetime | None = None,
) -> Released:
    """End a live claim now as a failed attempt: the same backoff and dead-lettering as an expired
    lease. A token that no longer holds the row changes nothing."""
    params = {
        "queue_id": queue_id,
        "orchestrator_id": orchestrator_id,
        "claim_token": claim_token,
        "reason": reason,
        **end_claim_params(settings, now),
    }
    with transaction(pool) as tx:
        wait_for_turn(tx, "release_peek", params)  # (a start dead-lettered with what is behind it)
        row = tx.one(query("release"), params)
        assert row is not None
        if row["matched"]:
            if row["failed"]:
                return Released(
                    "released", None, dead_lettered=True, notice_ids=tuple(row["notice_ids"] or ())
                )
            return Released("released", row["available_at"])
        miss = tx.one(query("ack_explain_miss"), params)
        assert miss is not None
        if miss["live_token"] == claim_token:
            # Already released (or its expired lease swept): the claim has ended; say so again.
            return Released("released", miss["live_available_at"])
        if miss["live_token"] is not None or miss["session_status"] in ("queued", "delivered"):
            return Released("claim_superseded")
        return Released("not_found")


def release_to_route_again(
    tx: Tx, orchestrator_id: UUID, queue_id: UUID, claim_token: UUID, reason: str
) -> list[tuple[DispatchPayload, str | None]] | None:
    """In the caller's transaction: end the live claim of this token on a `start` and delete it,
    with the messages queued behind it, their sessions `cancelled` (`reason`): each message (in
    order) and its user, for the caller to route again. The agent session's turn is taken first,
    so a stop either cancels the start before this or finds the routing requests written in its
    place. None, having written nothing: the token holds no live claim of a start of this machine."""
    tx = require_tx(tx, "release_to_route_again")
    params: dict[str, Any] = {
        "queue_id": queue_id,
        "orchestrator_id": orchestrator_id,
        "claim_token": claim_token,
    }
    peek = wait_for_turn(tx, "release_start_peek", params)
    if peek is None:
        return None
    locked = tx.one(query("release_start_lock"), params)
    if locked is None:
        return None
    rows = tx.all(query("release_start_remove"), {**params, **peek, "seq": locked["seq"], "reason": reason})
    return [(DispatchPayload.from_wire(r["payload"]), r["linear_user_id"]) for r in rows]


class ExpiredBatch(NamedTuple):
    picked: int  # expired claims locked by the pick
    requeued: int
    dead_lettered: int
    passed: list[UUID]  # picked, but left as they are: their agent session's turn was taken


def end_expired_claims(tx: Tx, params: dict[str, Any], passed: list[UUID]) -> ExpiredBatch:
    """In the caller's transaction, one batch of the sweep (`params`: `batch` and `end_claim_params`):
    expired claims locked (`sweep_pick`, skipping `passed`), then each re-queued with backoff or
    dead-lettered (`sweep`), a start of an agent session only with its turn."""
    tx = require_tx(tx, "end_expired_claims")
    picked = tx.all(query("sweep_pick"), {**params, "passed": passed})
    ids = [r["id"] for r in picked if r["turn"]]
    row = tx.one(query("sweep"), {**params, "ids": ids}) if ids else None
    return ExpiredBatch(
        picked=len(picked),
        requeued=row["requeued"] if row else 0,
        dead_lettered=row["dead_lettered"] if row else 0,
        passed=[r["id"] for r in picked if not r["turn"]],
    )


class SweepResult(NamedTuple):
    requeued: int
    dead_lettered: int
    rerouted: int = 0
    rescued: int = 0  # revoked machines whose leftover work was moved or cancelled


def sweep(pool: Pool, settings: Settings, now: datetime | None = None) -> SweepResult:
    """Re-queue every expired lease with backoff, dead-letter those at the attempt limit. Each batch
    is one transaction of two statements (`end_expired_claims`); concurrent sweeps split the rows
    between them (SKIP LOCKED) and never count one twice."""
    requeued = dead = 0
    params = {"batch": SWEEP_BATCH, **end_claim_params(settings, now)}
    passed: list[UUID] = []  # rows whose turn was taken: left to the next sweep
    while True:
        with transaction(pool) as tx:
            ended = end_expired_claims(tx, params, passed)
        requeued += ended.requeued
        dead += ended.dead_lettered
        passed += ended.passed
        if ended.picked < SWEEP_BATCH:
            break
    rerouted = 0
    if settings.reroute_after_seconds > 0:
        while True:  # a batch per transaction: the starts picked (and their turns), then moved
            with transaction(pool) as tx:
                picked = tx.all(
                    query("reroute_quiet_pick"),
                    {"after": settings.reroute_after_seconds, "batch": REROUTE_BATCH},
                )
                if picked:
                    batch = [{k: str(v) if isinstance(v, UUID) else v for k, v in r.items()} for r in picked]
                    row = tx.one(query("reroute_quiet_move"), {"picked": Jsonb(batch)})
                    assert row is not None
                    rerouted += row["rerouted"]
            if len(picked) < REROUTE_BATCH:  # (or some turns were taken: the next sweep goes on)
                break
    # Work left on a revoked machine (`revoked_with_work` says how it can happen): revoked again,
    # each in its own transaction, which moves it to the user's active machine or cancels it.
    with lend(pool) as conn:
        leftover = [r["id"] for r in conn.execute(query("revoked_with_work"), {"batch": SWEEP_BATCH})]
    rescued = sum(1 for oid in leftover if revoke(pool, oid) is not None)
    with statement(pool) as tx:
        tx.execute(
            query("record_sweep"), {"requeued": requeued, "dead_lettered": dead, "kept": SWEEP_RUNS_KEPT}
        )
    return SweepResult(requeued, dead, rerouted, rescued)


def stop_element(
    n: int,
    *,
    org_id: str,
    linear_user_id: str | None,
    message: DispatchPayload,
    issue_given: bool,
    delivery_key: str,
    unstarted_notice: str,
    at: datetime | None,
) -> dict[str, Any]:
    """One stop as an element of the JSON batch a transaction of stops sends to each of its
    statements (`send_cancel_agent_sessions`, `send_stops`; `record_stop`, routing's cancel): its
    element `n` (`take_turns`), the agent session, the `stop` for its holder (`message`; the
    holder's issue is used when the webhook names none, `issue_given` False), Linear's notice when
    nobody holds it (`unstarted_notice`), the delivery's key, and when the person pressed stop."""
    if message.kind != "stop" or message.agent_session_id is None:
        raise ValueError("a stop element is for an agent session's stop")
    return {
        "n": n,
        "org_id": org_id,
        "agent_session_id": message.agent_session_id,
        "linear_user_id": linear_user_id,
        "session_id": str(uuid4()),
        "issue_given": issue_given,
        "issue_id": message.issue.id,
        "issue_identifier": message.issue.identifier,
        "payload": message.wire(),
        "notice_issue_id": message.issue.id if issue_given else None,
        "body": unstarted_notice,
        "key": delivery_key,
        "at": at.isoformat() if at is not None else None,
    }


def send_cancel_agent_sessions(tx: Tx, stops: Jsonb) -> psycopg.Cursor[DictRow]:
    """A transaction of stops' cancel of every undelivered message of their agent sessions, sent
    after `take_turns` (`cancel_agent_session`: for each only when that statement recorded its
    delivery). `stops`: the batch of `stop_element`s. Sent, not waited for: its rows, each cancelled
    session's id and its element `n`, are read from the cursor."""
    tx = require_tx(tx, "send_cancel_agent_sessions")
    return tx.execute(query("cancel_agent_session"), {"batch": stops, "reason": "stopped in Linear"})


def send_stops(tx: Tx, stops: Jsonb) -> psycopg.Cursor[DictRow]:
    """The last statement of a transaction of stops, sent after their cancel (`stop_for_delivery`):
    for each, a `stop` for the machine that holds the agent session, or, held by none, its notice
    for Linear; and what its delivery did. `stops`: the batch of `stop_element`s. Sent, not waited
    for: its rows, one per element in the order of `n` (session_id, the stop's or None; notice_id,
    the notice's or None), are read from the cursor."""
    tx = require_tx(tx, "send_stops")
    return tx.execute(query("stop_for_delivery"), {"batch": stops, "now": None})


# --- Operators' actions and the revoke: the queue's writes they make (queue.sql, last section). ---


class Requeued(NamedTuple):
    queue_id: UUID
    machine: str  # the name of the machine it is queued for
    notice_ids: list[UUID]  # Linear notices the statement wrote, to send after commit


def requeue_failed(tx: Tx, session_id: UUID, orchestrator_id: UUID) -> Requeued | None:
    """In the caller's transaction (an operator's retry, its locks held): a failed session's dead
    letter queued again for `orchestrator_id` (`session_requeue`). None, having written nothing:
    no dead letter, or that machine was revoked meanwhile."""
    tx = require_tx(tx, "requeue_failed")
    row = tx.one(query("session_requeue"), {"id": session_id, "orchestrator_id": orchestrator_id})
    if row is None:
        return None
    return Requeued(row["queue_id"], row["machine"], list(row["notice_ids"] or []))


class Cancelled(NamedTuple):
    cancelled: bool  # the session itself (False: it was delivered meanwhile)
    behind: int  # messages of its conversation queued behind it, cancelled with it
    notice_ids: list[UUID]


def cancel_queued(tx: Tx, session_id: UUID, reason: str) -> Cancelled:
    """In the caller's transaction (an operator's cancel, its locks held): the session's queue row
    deleted, with what its conversation queued behind it, their sessions `cancelled` (`reason`)
    and Linear told (`session_cancel`)."""
    tx = require_tx(tx, "cancel_queued")
    row = tx.one(query("session_cancel"), {"id": session_id, "reason": reason})
    assert row is not None
    return Cancelled(bool(row["cancelled"]), int(row["with_behind"]) - 1, list(row["notice_ids"] or []))


def move_start(tx: Tx, session_id: UUID, source: UUID, target: UUID) -> str | None:
    """In the caller's transaction (an operator's move, its locks held): an unclaimed start on
    `source`, with the messages queued behind it, moved to `target` (`session_move`). The target's
    name; None, having written nothing: it is claimed, or the target is not another active
    machine of the same user."""
    tx = require_tx(tx, "move_start")
    row = tx.one(query("session_move"), {"id": session_id, "source": source, "target": target})
    assert row is not None
    return str(row["target_name"]) if row["moved"] else None


def note_routing(tx: Tx, session_id: UUID, note: str) -> None:
    """In the routing transaction: how the session's machine was chosen, for its page."""
    require_tx(tx, "note_routing").execute(query("session_routing_note"), {"id": session_id, "note": note})


class Revoked(NamedTuple):
    moved: int  # undelivered starts now with the same user's most recently seen active machine
    cancelled: int  # the rest (prompts, stops, starts no other machine could take)
    notice_ids: list[UUID]  # Linear notices the transaction wrote, to send after commit


def revoke(pool: Pool, orchestrator_id: UUID) -> Revoked | None:
    """One transaction: the token stops working (`orchestrators.mark_revoked`, which waits for
    every enqueue to the machine), and the machine's undelivered work is never stranded: starts
    move to the user's most recently seen active machine, the rest is cancelled (Linear told, for
    agent sessions). None: no such machine. Revoking again changes nothing."""
    params = {"id": orchestrator_id}
    with transaction(pool) as tx:
        if not orchestrators.mark_revoked(tx, orchestrator_id):
            return None
        moved = tx.one(query("revoke_move_starts"), params)
        rest = tx.one(query("revoke_cancel_rest"), {**params, "reason": "its machine was revoked"})
    assert moved is not None and rest is not None
    return Revoked(int(moved["moved"]), int(rest["cancelled"]), list(rest["notice_ids"] or []))
