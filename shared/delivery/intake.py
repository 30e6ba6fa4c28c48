"""Webhook intake: what an event asks for is decided once, from the event alone
(`shared.linear.webhooks.what_it_asks`), and each kind is carried out one way (`CARRIED_OUT_BY`):

  kind of event                           what it asks        carried out by
  --------------------------------------  ------------------  -------------------------------------------
  issue edited (assignee unchanged),      nothing             `record_ignored`, through the group commit
  another type, another app uninstalled
  agent session `created` with no issue   tell_unroutable     the intake transaction: an `error` for Linear
  our app uninstalled (OAuthApp revoked)  disconnect          the intake transaction: the org disconnected
  issue created with an assignee, or      start               `issue_changes_for_delivery` (an issue's:
  assigned with nobody before; agent                          its assignment, the undelivered dispatch
  session `created` by a person                               cancelled) / `route_and_start_agent_
                                                              sessions_many_for_delivery`, through the
                                                              group commit of issues / agent sessions
  agent session `created` by automation   start_for_assignee  the intake transaction: a routing request,
                                                              routed after commit (Linear names the assignee)
  issue unassigned or removed             cancel              `issue_changes_for_delivery`, through the
                                                              group commit of issues (`_issue_change`)
  issue re-assigned (from someone)        cancel_and_start    `issue_changes_for_delivery`, through the
                                                              group commit of issues (`_issue_change`)
  `prompted`; with the `select` signal    follow_up; answer   `follow_ups_for_delivery`, through the group
                                                              commit
  `prompted` with the stop signal         stop                `take_turns` + `routing_cancel_agent_session`
                                                              + `cancel_agent_session` + `record_stop` +
                                                              `stop_for_delivery`, together (`_stop_agent_
                                                              sessions`, through the group commit)

Every way records the delivery with everything it causes in one transaction (a statement that is
its own, or `shared.plumbing.db.together`'s, or the intake transaction): the delivery's keys, cancelled
sessions, the new message's session and queue row, the Linear notice that says so. Either all of it
commits or none of it does, so a crash mid-request leaves Linear's retry to find nothing recorded
and try again. "Together" (a stop's way) sends a transaction's statements at once
(`shared.plumbing.db.together`): the first, `take_turns`, records the delivery and takes its agent
session's turn, and the ones after read its verdict in SQL, so nothing waits for a decision made
here between them.

What the database decides is decided inside the way of the kind: a dispatch to cancel, no machine
for the user, a machine revoked meanwhile (the way is tried again, a few rounds: `ROUNDS`), a
delivery seen before (`duplicate`). A start's statement (an issue's assignment, an agent
session's) waits for its turn and decides there, with reads taken after the turn: an issue's
assignment superseded, an agent session already started or stopped (each recorded), the issue's
undelivered dispatch to cancel, which machine, no machine (an agent session's: Linear told why),
or, the user's machines differing, that Linear is asked the repository first. An issue's
dispatch committed by the turn's previous holder is too new for the statement's own snapshot to
delete: it writes nothing for that element, which is tried again in a new statement, as a revoke
is. A follow-up's statement waits for its agent session's turn too, and decides there: written
before a stop (recorded), a `prompt` for the holder, the person's answer to a repository question,
behind a start still waiting to be routed or for an automation's agent session (a routing
request), nobody holding it (a start for the writer's machine, or a routing request, or Linear
told no machine can take it).

What each event does (the conversation, drawn in the README):
- Issue assigned (created with an assignee, or re-assigned): a `start` to the assignee's machine,
  cancelling the issue's undelivered assignment dispatch. Unassigned or removed: that cancel only.
  Never touches an agent session's messages. No machine for the user: ignored, Linear not told.
- Agent session `created`: a `start` to the machine of the user who started it, with Linear's
  context; a first `thought` for Linear. Started by an automation (no creator): the issue's
  assignee, whom only Linear's API can name, so the webhook's transaction writes a routing request
  and the read and the routing happen after commit (`shared.delivery.routing`).
- `prompted`: a `prompt` to the machine that holds the agent session (never re-routed); with no
  holder yet, routed as a `start`; behind a start still waiting to be routed, routed after it.
- `prompted` with the stop signal: every undelivered message of the agent session cancelled, and a
  `stop` queued for the machine that had one delivered; if none had, Linear gets a final response.
- An agent session that nothing can take: an `error` activity, so Linear does not wait on it.
- The app uninstalled (`OAuthApp` `revoked`): the org is disconnected; its posts wait in the outbox.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, NamedTuple, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from shared.delivery.models import DispatchPayload, Enqueued
from shared.delivery.queue import (
    NO_MACHINE,
    OVERTAKEN,
    REVOKED,
    SUPERSEDED,
    SWEEP_BATCH,
    UNROUTABLE,
    Asked,
    FollowUp,
    Ignored,
    IssueChange,
    IssueChanged,
    IssueOutcome,
    IssueOvertaken,
    MachineRevoked,
    Routed,
    RouteOutcome,
    Start,
    change_issues,
    follow_ups,
    route_and_enqueue,
    route_and_enqueue_many,
    send_cancel_agent_sessions,
    send_stops,
    stop_element,
)
from shared.linear.webhooks import Asks, Intent, Webhook, what_it_asks

# (ROUTING_ON_USE) The routing chain (`shared.delivery.routing`: the repository choice, Linear's API
# and auth, the machines' repositories), Linear's notices and its auth are imported where they are
# used: an issue's plain assignment, most of the webhooks Linear sends, needs none of them, and a
# cold instance's first such webhook would load them all (bench/README.md, "Cold start").
from shared.plumbing.batching import Combiner, firsts, one_per_key
from shared.plumbing.db import DEFAULT_DEADLINE_SECONDS, Pool, Tx, jsonb_once, statement, together
from shared.plumbing.in_order import InOrder
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.wire.messages import IssueRef, MessageKind

T = TypeVar("T")
R = TypeVar("R")
STOPPED_BEFORE_START = "Stopped before any machine started working on it."


@dataclass(frozen=True)
class Received:
    answer: dict[str, Any]  # the contract's answer body
    notice_ids: list[UUID] = field(default_factory=list)  # Linear notices written, to send after commit
    recorded: bool = False  # the delivery's outcome is written already (by the enqueue)
    route_ids: list[UUID] = field(default_factory=list)  # routing requests written, to run after commit


def receive(pool: Pool, hook: Webhook, delivery: str | None, own_client_id: str | None = None) -> Received:
    """Apply one verified, fresh webhook: what it asks (`what_it_asks`), carried out by the one way
    of that kind (`CARRIED_OUT_BY`). `delivery` is Linear-Delivery; `own_client_id`, this service's
    Linear OAuth client (LINEAR_CLIENT_ID).

    Webhooks of one issue, or of one agent session, are handled one at a time in arrival order in
    this process (`shared.plumbing.in_order`): one waiting in a group commit's line holds no turn yet, and a
    later one of the same key must not overtake it."""
    ask = what_it_asks(hook, own_client_id)
    key, content_key = hook.delivery_keys(delivery)
    with IN_ORDER.place(_order_key(hook, ask.plan)):
        return CARRIED_OUT_BY[ask.kind](pool, hook, ask.plan, key, content_key)


# Within this process, webhooks of one issue or agent session in arrival order (`shared.plumbing.in_order`).
IN_ORDER = InOrder(DEFAULT_DEADLINE_SECONDS)


def _order_key(hook: Webhook, plan: Intent) -> tuple[str, str, str] | None:
    """What orders this webhook among others: its agent session, or the issue whose assignment it
    changes; None for an event that orders against nothing (an edit, the app uninstalled)."""
    if hook.org_id is None or (plan.kind == "ignore" and not plan.agent_session_id):
        return None
    if plan.agent_session_id is not None:
        return (hook.org_id, "agent_session", plan.agent_session_id)
    issue = plan.cancel_issue_id or (plan.issue.id if plan.issue is not None else None)
    return None if issue is None else (hook.org_id, "issue", issue)


# A way: (pool, hook, plan, delivery key, content key) -> the answer, everything written.
Way = Callable[[Pool, Webhook, Intent, str, str], Received]

# The machine chosen can be revoked while a statement waits for its turn, and a dispatch of an issue
# can be committed by the turn's previous holder too late for an issue's statement to cancel it:
# the statement then writes nothing for the element, and it is written again, in a new statement
# that sees the revoke (another machine of the user, or no machine) or the dispatch. Each round
# needs another transaction's commit during it, so a few rounds end it; after the last, nothing
# is written, and the route answers 503: Linear retries the delivery.
ROUNDS = 3


def _nothing(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """An event that does nothing (an issue edited without its assignee changing: Linear sends an
    update for every change to an issue): its delivery recorded as ignored, through the pool's
    group commit of such deliveries; seen before, answered `duplicate`."""
    if _ignored_deliveries(pool).submit((key, content_key)):
        return Received(_ignored(plan), recorded=True)
    return _duplicate(pool, key, content_key)


def _duplicate(pool: Pool, key: str, content_key: str) -> Received:
    """A delivery seen before, which wrote nothing: the session the first one made."""
    with statement(pool) as tx:
        seen = tx.one(query("delivery_session"), {"key": key, "content_key": content_key})
    sid = seen["session_id"] if seen else None
    return Received({"status": "duplicate", "sessionId": str(sid) if sid else None})


def _transaction(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """The intake transaction (`_receive`): the way of the kinds that queue nothing, so no machine
    chosen can be revoked under them (an agent session with no issue, the app uninstalled, a start
    Linear must route; a stop of a webhook without an org)."""
    return _receive(pool, hook, plan, key, content_key)


def _start(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """A start for a person's machine: an issue's (created with an assignee, or assigned with
    nobody before) is its assignment (`_issue_change`); an agent session's (`created` by a person),
    its statement through the pool's group commit of agent sessions' starts, which waits for the
    turn and decides the start whole (`_started`). The machine chosen revoked meanwhile: the
    statement again, in rounds."""
    if plan.agent_session_id is None:
        return _issue_change(pool, hook, plan, key, content_key)
    assert hook.org_id is not None and plan.issue is not None and plan.user_id is not None
    message = DispatchPayload(
        issue=plan.issue, agent_session_id=plan.agent_session_id, kind="start", prompt=plan.prompt
    )
    start = Start(hook.org_id, plan.user_id, message, key, content_key, plan.event_at)
    outcome = _submitted(_agent_session_starts(pool), start, f"agent session {plan.agent_session_id}")
    return _started(pool, key, content_key, outcome)


def _submitted(group_commit: Combiner[Any, Any], item: Any, what: str) -> Any:
    """`item` written through its group commit, again while nothing was written for it (the
    machine chosen revoked meanwhile, an issue's dispatch committed too late for the statement to
    cancel), in rounds (`ROUNDS`); the last round's reaches the caller, as an error."""
    outcome = group_commit.submit(item)
    for _ in range(ROUNDS - 1):
        if outcome not in (REVOKED, OVERTAKEN):
            return outcome
        outcome = group_commit.submit(item)
    if outcome == REVOKED:
        raise MachineRevoked(f"every machine chosen for {what} was revoked meanwhile")
    if outcome == OVERTAKEN:
        raise IssueOvertaken(f"{what} changed again in every round")
    return outcome


def _started(pool: Pool, key: str, content_key: str, outcome: RouteOutcome) -> Received:
    """The answer to a start or a follow-up from what its statement wrote (`route_and_enqueue_many`,
    `follow_ups`)."""
    if outcome is None:
        return _duplicate(pool, key, content_key)
    if outcome == NO_MACHINE:
        # Most assignments in a workspace go to people without a machine, and Linear is not told
        # about a plain issue.
        return Received({"status": "ignored", "reason": "no_orchestrator"}, recorded=True)
    if outcome == SUPERSEDED:
        return Received({"status": "ignored", "reason": "assignment_superseded"}, recorded=True)
    if isinstance(outcome, Ignored):  # (an agent session's; Linear told why when nobody can take it)
        told = [] if outcome.notice_id is None else [outcome.notice_id]
        return Received({"status": "ignored", "reason": outcome.reason}, told, recorded=True)
    if isinstance(outcome, Asked):  # which of the user's machines depends on the repository
        answer = {"status": "routing", "routeId": str(outcome.route_id)}
        return Received(answer, recorded=True, route_ids=[outcome.route_id])
    assert isinstance(outcome, Routed), outcome
    enq = outcome.enqueued
    return Received(_dispatched(enq, outcome.orchestrator_id, outcome.kind), _notices(enq), recorded=True)


def _follow_up(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """A follow-up (`prompted`; with the `select` signal, maybe the person's answer to a repository
    question): its statement through the pool's group commit of follow-ups (`follow_ups`), which
    waits for the agent session's turn and decides the follow-up whole there: a `prompt` for the
    machine that holds the agent session; nobody holding it, a start for the writer's machine, or a
    routing request (behind a start still waiting to be routed, or to ask Linear); the answer to a
    question; ignored (written before a stop, or no machine). The machine revoked meanwhile: the
    statement again, in rounds."""
    assert hook.org_id is not None and plan.agent_session_id is not None
    message = DispatchPayload(
        issue=plan.issue or IssueRef(id=""),
        agent_session_id=plan.agent_session_id,
        kind="prompt",
        prompt=plan.prompt,
    )
    follow_up = FollowUp(
        hook.org_id,
        plan.user_id,
        message,
        key,
        content_key,
        plan.activity_at,
        _picked(plan),
        plan.issue is not None,
    )
    return _started(pool, key, content_key, _submitted(_follow_ups(pool), follow_up, "agent session"))


def _picked(plan: Intent) -> str | None:
    """A `select` signal's choice (its body, else its metadata's value or label); None for a plain
    follow-up."""
    prompt = plan.prompt
    if prompt is None or prompt.signal != "select":
        return None
    meta = prompt.signal_metadata or {}
    return prompt.body or str(meta.get("value") or meta.get("label") or "")


def _stop(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """Linear's stop signal: through the pool's group commit of stops (`_stop_agent_sessions`), its
    transaction's statements sent at once, each reading the delivery's verdict in SQL. A delivery
    seen before wrote nothing: `duplicate`."""
    org, agent_session = hook.org_id, plan.agent_session_id
    if org is None or agent_session is None:  # (nothing to stop: ignored, as the transaction says)
        return _transaction(pool, hook, plan, key, content_key)
    message = DispatchPayload(
        issue=plan.issue or IssueRef(id=""), agent_session_id=agent_session, kind="stop", prompt=None
    )
    stop = Stop(org, agent_session, _record_params(hook, plan, key, content_key), plan, message)
    received = _combiner(pool, "stops", _stop_agent_sessions).submit(stop)
    return _duplicate(pool, key, content_key) if received is None else received


class Stop(NamedTuple):
    """An agent session's stop as one webhook asks for it (`_stop_agent_sessions`). `record`: the
    delivery's `record_delivery` parameters; `message`: the `stop` for the holder (its issue the
    webhook's, or the holder's when the webhook names none)."""

    org_id: str
    agent_session_id: str
    record: dict[str, Any]
    plan: Intent
    message: DispatchPayload


def _stop_agent_sessions(pool: Pool, stops: list[Stop]) -> list[Received | None]:
    """Stops written in one transaction, its statements sent at once (`shared.plumbing.db.together`),
    five statements for the whole batch (one JSON array, one element per stop): `take_turns` (the
    deliveries recorded, every agent session's turn taken, waiting, in the order of the turns'
    keys, so two such transactions never wait for each other's turns in a circle, and no turn is
    waited for while a row lock is held); then, each reading every element's verdict in SQL: what
    no machine has yet cancelled (messages waiting to be routed, queued messages), the stops
    recorded (`record_stop`), and the machine that had one delivered told with a `stop`, or, if none
    had, Linear with a final response (`send_stops`). Nothing is decided here between them: one
    round trip, one commit. One answer per stop, in order; None: the delivery was seen before, and
    nothing was written. A second stop of one agent session in the batch (never from one process,
    whose webhooks of an agent session go one at a time) is written after it, in a transaction of
    its own, as it would be had it come later."""
    return one_per_key(stops, lambda s: (s.org_id, s.agent_session_id), partial(_stop_distinct, pool))


def _stop_distinct(pool: Pool, stops: list[Stop]) -> list[Received | None]:
    """`_stop_agent_sessions` of stops of distinct agent sessions."""
    from shared.delivery import routing  # (ROUTING_ON_USE)

    written = firsts((s.record["key"], s.record["content_key"]) for s in stops)
    with together(pool) as tx:
        turns = _take_turns(tx, [(i, stops[i].record) for i in written])
        batch = jsonb_once([_stop_element(i, stops[i]) for i in written])  # (four statements')
        routing.cancel(tx, batch)
        cancel = send_cancel_agent_sessions(tx, batch)
        # After the cancel: a release or the sweep that dead-lettered one of its messages meanwhile
        # (a follow-up's, without the turn) held that row, the cancel waited for it, and this
        # statement, with a snapshot taken after, marks its dead letter too (`record_stop`).
        tx.execute(query("record_stop"), {"batch": batch})
        sent = send_stops(tx, batch)
    verdicts = _verdicts(turns)
    cancelled: dict[int, list[str]] = {}
    for row in cancel.fetchall():
        cancelled.setdefault(row["n"], []).append(str(row["id"]))
    told = {row["n"]: row for row in sent.fetchall()}
    out: list[Received | None] = [None] * len(stops)
    for i in written:
        out[i] = _stopped(verdicts.get(i), cancelled.get(i, []), told[i])
    return out


def _stop_element(n: int, stop: Stop) -> dict[str, Any]:
    plan = stop.plan
    return stop_element(
        n,
        org_id=stop.org_id,
        linear_user_id=plan.user_id,
        message=stop.message,
        issue_given=plan.issue is not None,
        delivery_key=stop.record["key"],
        unstarted_notice=STOPPED_BEFORE_START,
        at=plan.activity_at,
    )


def _stopped(turn: DictRow | None, cancelled: list[str], row: DictRow) -> Received | None:
    """What one stop of `_stop_agent_sessions` did, from its statements' rows (read after the commit:
    its statements wrote what the delivery did)."""
    if turn is None:  # (seen before: nothing written)
        return None
    sid = row["session_id"]
    answer = {
        "status": "stopped",
        "cancelledSessionIds": cancelled,
        "stopSessionId": str(sid) if sid else None,
    }
    return Received(answer, [] if row["notice_id"] is None else [row["notice_id"]], recorded=True)


def _issue_change(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """An issue's assignment event (created with an assignee, assigned, re-assigned, unassigned,
    removed): its statement through the pool's group commit of issues (`change_issues`), which
    waits for the issue's turn and decides it whole there: superseded by a later change handled
    already (recorded); the issue's undelivered assignment dispatch cancelled; a start for the
    assignee's machine (none for an unassignment), or, the user's machines differing, a routing
    request. The machine revoked meanwhile, or a dispatch committed too late for the statement to
    cancel: the statement again, in rounds."""
    org = hook.org_id
    assert org is not None
    issue = plan.cancel_issue_id if plan.kind == "cancel" else plan.issue.id if plan.issue else None
    assert issue is not None
    start = None
    if plan.kind != "cancel":
        assert plan.issue is not None and plan.user_id is not None
        start = DispatchPayload(issue=plan.issue, agent_session_id=None, kind="start", prompt=plan.prompt)
    change = IssueChange(org, issue, key, content_key, plan.event_at, _why(hook), plan.user_id, start)
    outcome = _submitted(_issue_changes(pool), change, f"issue {issue}")
    return _changed(pool, change, outcome)


def _changed(pool: Pool, change: IssueChange, outcome: IssueOutcome) -> Received:
    """The answer to an issue's assignment event from what its statement wrote (`change_issues`):
    its start's, as `_started` answers a start, with the session it cancelled."""
    if not isinstance(outcome, IssueChanged):  # (seen before, or superseded)
        return _started(pool, change.delivery_key, change.content_key, outcome)
    start, cancelled = outcome
    if cancelled is None:
        if start is None:  # (an unassignment)
            return Received({"status": "ignored", "reason": "nothing_to_cancel"}, recorded=True)
        return _started(pool, change.delivery_key, change.content_key, start)
    if isinstance(start, Routed | Asked):
        received = _started(pool, change.delivery_key, change.content_key, start)
        received.answer["cancelledSessionId"] = str(cancelled)
        return received
    return Received({"status": "cancelled", "sessionId": str(cancelled)}, recorded=True)


def _take_turns(tx: Tx, records: list[tuple[int, dict[str, Any]]]) -> psycopg.Cursor[DictRow]:
    """The deliveries of one transaction recorded and their turns taken (`take_turns`: every turn
    waited for in the order of the turns' keys, before anything is written), each with its verdict
    kept for the statements sent after it. `records`: each element's `n` and its `record_delivery`
    parameters (`_record_params`); their keys distinct. Sent, not waited for: its rows, one per
    delivery recorded (`n`), are read from the cursor (`_verdicts`)."""
    batch = [{**record, "n": n} for n, record in records]
    return tx.execute(query("take_turns"), {"batch": Jsonb(batch)})


def _verdicts(turns: psycopg.Cursor[DictRow]) -> dict[int, DictRow]:
    """`take_turns`'s rows by element: the deliveries it recorded."""
    return {row["n"]: row for row in turns.fetchall()}


def _why(hook: Webhook) -> str:
    """The reason a cancelled assignment dispatch gives."""
    return "issue removed" if hook.action == "remove" else f"issue {hook.action}: assignment changed"


CARRIED_OUT_BY: dict[Asks, Way] = {
    "nothing": _nothing,
    "tell_unroutable": _transaction,
    "disconnect": _transaction,
    "start": _start,
    "start_for_assignee": _transaction,
    "cancel": _issue_change,
    "cancel_and_start": _issue_change,
    "follow_up": _follow_up,
    "answer": _follow_up,
    "stop": _stop,
}


BATCH = 64  # the most webhooks written in one statement
# Batches of one kind (issues' changes, agent sessions' starts, follow-ups, stops) written at once:
# with one, every caller waited for the batch ahead of it to commit (its WAL flush) while the cores
# idled; with two, the next batch is written meanwhile (bench/README.md, "What was tried"). Two
# batches holding one issue, or one agent session, are kept apart by its turn: the starts'
# statements wait for each, in the order of their keys; the follow-ups' tries it without waiting
# (`devpilot_agent_session_holder`).
LANES = 2
# Edits (deliveries that do nothing) in one lane: their statement is short beside its commit, and
# a second lane halved their batches, costing Postgres more an edit for fewer edits a second
# (bench/README.md, "What was tried").
EDIT_LANES = 1
_COMBINERS: weakref.WeakKeyDictionary[Pool, dict[str, Combiner[Any, Any]]] = weakref.WeakKeyDictionary()
_COMBINERS_LOCK = threading.Lock()


def _combiner(
    pool: Pool,
    name: str,
    many: Callable[[Pool, list[Any]], list[Any]],
    one: Callable[[Pool, Any], Any] | None = None,
    lanes: int = LANES,
) -> Combiner[Any, Any]:
    """The pool's group commit called `name` (one per pool and name, made on first use). `one`:
    how an item alone is written, when not as a batch of one; `lanes`: how many batches at once."""
    with _COMBINERS_LOCK:
        kinds = _COMBINERS.get(pool)
        if kinds is None:
            kinds = _COMBINERS[pool] = {}
        combiner = kinds.get(name)
        if combiner is None:
            alone = None if one is None else partial(one, pool)
            combiner = kinds[name] = Combiner(partial(many, pool), alone, BATCH, lanes)
        return combiner


def _agent_session_starts(pool: Pool) -> Combiner[Start, RouteOutcome]:
    """The pool's group commit of agent sessions' starts. A start alone is written by
    `_one_statement`, the same statement with one element; every start waits for its turn. A second
    start of one agent session in a batch, a copy of a delivery included, is written after the
    first (`_starts`): a copy then finds the first one's record, and is answered `duplicate`."""
    return _combiner(pool, "agent_sessions", _starts, _one_statement)


def _starts(pool: Pool, starts: list[Start]) -> list[RouteOutcome]:
    """Agent sessions' starts written in one statement (`route_and_enqueue_many`), by agent session
    (`_in_statements`)."""
    return _in_statements(
        pool, starts, lambda s: (s.org_id, s.message.agent_session_id), route_and_enqueue_many
    )


def _issue_changes(pool: Pool) -> Combiner[IssueChange, IssueOutcome]:
    """The pool's group commit of issues' assignment events (`change_issues`). A second event of one
    issue in a batch, a copy of a delivery included, is written after the first."""
    return _combiner(pool, "issues", _issue_changes_written)


def _issue_changes_written(pool: Pool, batch: list[IssueChange]) -> list[IssueOutcome]:
    return _in_statements(pool, batch, lambda c: (c.org_id, c.issue_id), change_issues)


def _follow_ups(pool: Pool) -> Combiner[FollowUp, RouteOutcome]:
    """The pool's group commit of follow-ups (`follow_ups`). A second follow-up of one agent session
    in a batch, a copy of a delivery included, is written after the first."""
    return _combiner(pool, "follow_ups", _follow_ups_written)


def _follow_ups_written(pool: Pool, batch: list[FollowUp]) -> list[RouteOutcome]:
    return _in_statements(pool, batch, lambda f: (f.org_id, f.message.agent_session_id), follow_ups)


def _in_statements(
    pool: Pool,
    items: list[T],
    key: Callable[[T], Hashable],
    write: Callable[[Tx, list[T]], list[R]],
) -> list[R]:
    """A batch written by `write` in one statement, its own transaction; a second item of one `key`
    (never from one process, whose webhooks of one key go one at a time; a copy of a delivery, say)
    written after the first, in a statement of its own, as it would be had it come later
    (`one_per_key`)."""

    def written(distinct: list[T]) -> list[R]:
        with statement(pool) as tx:
            return write(tx, distinct)

    return one_per_key(items, key, written)


def _one_statement(pool: Pool, start: Start) -> RouteOutcome:
    """A start that goes alone, in a statement of its own (`route_and_enqueue`)."""
    with statement(pool) as tx:
        return route_and_enqueue(
            tx,
            org_id=start.org_id,
            linear_user_id=start.linear_user_id,
            message=start.message,
            delivery_key=start.delivery_key,
            content_key=start.content_key,
            event_at=start.event_at,
        )


def _ignored_deliveries(pool: Pool) -> Combiner[tuple[str, str], bool]:
    """The pool's group commit of deliveries that do nothing: each recorded (True) or seen before."""
    return _combiner(pool, "ignored", record_ignored, lanes=EDIT_LANES)


def record_ignored(pool: Pool, deliveries: list[tuple[str, str]]) -> list[bool]:
    """Record deliveries that do nothing (their delivery key and content key) as `ignored`, in one
    statement that is its own transaction: for each, whether it was recorded now (False: seen
    before, or a copy of an earlier element's keys, which the intake transaction answers
    `duplicate`)."""
    written = firsts(deliveries)
    batch = [{"key": deliveries[i][0], "content_key": deliveries[i][1]} for i in written]
    with statement(pool) as tx:
        recorded = {r["delivery_key"] for r in tx.all(query("record_ignored"), {"batch": Jsonb(batch)})}
    out = [False] * len(deliveries)
    for i in written:
        out[i] = deliveries[i][0] in recorded
    return out


def _ignored(plan: Intent) -> dict[str, Any]:
    return {"status": "ignored", "reason": plan.reason or "not_routable"}


def _dispatched(enq: Enqueued, orch: UUID, kind: MessageKind | None) -> dict[str, Any]:
    """The webhook's answer for a queued message (`kind`: an agent session's message says which)."""
    answer: dict[str, Any] = {
        "status": "dispatched",
        "sessionId": str(enq.session_id),
        "queueId": str(enq.queue_id),
        "messageId": str(enq.message_id),
        "orchestratorId": str(orch),
    }
    if kind is not None:
        answer["kind"] = kind
    return answer


def _notices(enq: Enqueued) -> list[UUID]:
    """The Linear notice the enqueue's statement wrote, to send after the commit."""
    return [] if enq.notice_id is None else [enq.notice_id]


def _record_params(hook: Webhook, plan: Intent, key: str, content_key: str) -> dict[str, Any]:
    """The parameters of `record_delivery` (and of a stop's element of `take_turns`) for this event:
    the kinds of the intake transaction and the stops (an issue's assignment events are recorded by
    their own statement, `issue_changes_for_delivery`)."""
    # The events of one agent session that do something take turns (`agent_session_turn`).
    turn = hook.org_id is not None and plan.kind not in ("ignore", "disconnect")
    return {
        "key": key,
        "content_key": content_key,
        "org_id": hook.org_id,
        "agent_session_id": plan.agent_session_id if turn else None,
        # (an agent session `created`: may it still start?)
        "created": turn and plan.kind == "dispatch" and plan.agent_session_id is not None,
    }


def _receive(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    """The intake transaction: the delivery recorded (its turn taken, `record_delivery`), then what
    it does decided and written (`_apply`), its outcome with it. Its statements go in a pipeline
    (`shared.plumbing.db.together`): the ones whose rows decide nothing go with the next that does, or with
    the commit."""
    with together(pool) as tx:
        recorded = tx.one(query("record_delivery"), _record_params(hook, plan, key, content_key))
        if recorded is None:
            seen = tx.one(query("delivery_session"), {"key": key, "content_key": content_key})
            sid = seen["session_id"] if seen else None
            return Received({"status": "duplicate", "sessionId": str(sid) if sid else None})
        if recorded["seen"] is not None:  # (an agent session `created` after its start or stop)
            received = Received({"status": "ignored", "reason": f"agent_session_{recorded['seen']}"})
        else:
            received = _apply(tx, hook, plan, key)
        if not received.recorded:
            _finish(tx, key, received)
        return received


def _finish(tx: Tx, key: str, received: Received) -> None:
    """What the delivery did, written with it (sent, not waited for: it goes with the commit)."""
    tx.execute(
        query("finish_delivery"),
        {"key": key, "session_id": received.answer.get("sessionId"), "outcome": received.answer["status"]},
    )


def _apply(tx: Tx, hook: Webhook, plan: Intent, key: str) -> Received:
    """What the event does, in the intake transaction: the kinds whose way it is (`CARRIED_OUT_BY`:
    an event that Linear is told nothing can take, the app uninstalled, an agent session an
    automation started). `key`: the delivery's key."""
    org = hook.org_id
    if org is None or plan.kind == "ignore":
        if org and plan.unroutable_notice and plan.agent_session_id:
            return Received(
                {"status": "ignored", "reason": plan.reason}, _tell(tx, org, plan, "failed", UNROUTABLE)
            )
        return Received(_ignored(plan))
    if plan.kind == "disconnect":  # the app was uninstalled: posts wait for a new install
        from shared.linear import auth as linear_auth  # (ROUTING_ON_USE)

        linear_auth.disconnect(tx, org, "the app was uninstalled from the workspace (OAuthApp revoked)")
        return Received({"status": "ignored", "reason": plan.reason})
    # An agent session an automation started: Linear must be asked whose machine takes it (the
    # issue's assignee), routed after the commit.
    assert plan.kind == "dispatch" and plan.user_id is None and plan.issue is not None, plan
    return _route_to_assignee(tx, org, plan, key)


def _route_to_assignee(tx: Tx, org: str, plan: Intent, key: str) -> Received:
    """An agent session's start routed after the commit, once Linear has named the issue's assignee
    (`shared.delivery.routing`)."""
    assert plan.issue is not None
    message = DispatchPayload(
        issue=plan.issue, agent_session_id=plan.agent_session_id, kind="start", prompt=plan.prompt
    )
    from shared.delivery import routing  # (ROUTING_ON_USE)

    rid = routing.request(tx, org_id=org, message=message, delivery_key=key, need="assignee")
    return Received({"status": "routing", "routeId": str(rid)}, route_ids=[rid])


def _tell(tx: Tx, org: str, plan: Intent, kind: str, body: str) -> list[UUID]:
    from shared.linear import notices  # (ROUTING_ON_USE)

    nid = notices.write(
        tx,
        org_id=org,
        kind=kind,
        session_id=None,
        agent_session_id=plan.agent_session_id,
        issue_id=plan.issue.id if plan.issue else None,
        body=body,
    )
    return [] if nid is None else [nid]


PRUNE_BATCHES = 20  # at most this many batches a sweep: a backlog is worked off sweep by sweep


def prune_deliveries(pool: Pool, settings: Settings, now: datetime | None = None) -> int:
    """Forget the delivery records, and the agent sessions' stops (`record_stop`), older than
    `DEVPILOT_DELIVERY_RETENTION_HOURS` (by the sweep): oldest first, the sweep's SWEEP_BATCH of
    each per statement, each its own transaction (`prune_deliveries` in intake.sql), and at most
    PRUNE_BATCHES of them, so one sweep stays short however large the backlog (the first sweep
    after an upgrade, say). How many delivery records were forgotten."""
    if settings.delivery_retention_hours == 0:
        return 0
    params = {"hours": settings.delivery_retention_hours, "batch": SWEEP_BATCH, "now": now}
    pruned = 0
    for _ in range(PRUNE_BATCHES):
        with statement(pool) as tx:
            row = tx.one(query("prune_deliveries"), params)
        assert row is not None
        pruned += row["pruned"]
        if row["pruned"] < SWEEP_BATCH and row["stops_pruned"] < SWEEP_BATCH:
            break
    return pruned
