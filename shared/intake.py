"""Webhook intake: one transaction records the delivery with everything it causes.

Either all of it commits (the delivery's keys, cancelled sessions, the new message's session and
queue row, the Linear notice that says so) or none of it does, so a crash mid-request leaves
Linear's retry to find nothing recorded and try again. A start with nothing to cancel first (an
issue created with an assignee, an existing issue assigned with nothing undelivered, an agent
session `created`) is first tried as one statement that is a transaction of its own: one round trip
instead of four (through the group commit, several in one statement). So is an event that does nothing
(an issue edited without its assignee changing: Linear sends an update for every change to an
issue), whose delivery alone is recorded.

What each event does (the conversation, drawn in the README):
- Issue assigned (created with an assignee, or re-assigned): a `start` to the assignee's machine,
  cancelling the issue's undelivered assignment dispatch. Unassigned or removed: that cancel only.
  Never touches an agent session's messages. No machine for the user: ignored, Linear not told.
- Agent session `created`: a `start` to the machine of the user who started it, with Linear's
  context; a first `thought` for Linear. Started by an automation (no creator): the issue's
  assignee, whom only Linear's API can name, so the webhook's transaction writes a routing request
  and the read and the routing happen after commit (`shared.routing`).
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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from shared import linear_auth, notices, routing
from shared.batching import Combiner, firsts
from shared.db import DEFAULT_DEADLINE_SECONDS, Pool, Tx, statement, transaction
from shared.in_order import InOrder
from shared.linear import Intent, Webhook, intent
from shared.models import DispatchPayload, Enqueued
from shared.queue import (
    NO_MACHINE,
    SWEEP_BATCH,
    FollowUp,
    MachineRevoked,
    Routed,
    RouteOutcome,
    Start,
    cancel_issue,
    enqueue_dispatch,
    prompt_holders,
    route_and_enqueue,
    route_and_enqueue_many,
)
from shared.settings import Settings
from shared.sql import query
from shared.wire.messages import IssueRef, MessageKind

UNROUTABLE = "No machine is registered in devpilot for the person who started this; nothing was dispatched."
STOPPED_BEFORE_START = "Stopped before any machine started working on it."


@dataclass(frozen=True)
class Received:
    answer: dict[str, Any]  # the contract's answer body
    notice_ids: list[UUID] = field(default_factory=list)  # Linear notices written, to send after commit
    recorded: bool = False  # the delivery's outcome is written already (by the enqueue)
    route_ids: list[UUID] = field(default_factory=list)  # routing requests written, to run after commit


def receive(pool: Pool, hook: Webhook, delivery: str | None, own_client_id: str | None = None) -> Received:
    """Apply one verified, fresh webhook in one transaction. `delivery` is Linear-Delivery;
    `own_client_id`, this service's Linear OAuth client (LINEAR_CLIENT_ID).

    The machine it chose can be revoked while the transaction runs: the enqueue then writes nothing
    (MachineRevoked), the transaction rolls back whole, and the webhook is decided again, now seeing
    the revoke (another machine of the user, or no machine). Each round needs a revoke committed
    during it, so a few rounds end it; the last round's MachineRevoked reaches the caller, with
    nothing written, and the route answers 503: Linear retries the delivery.

    A start that may have nothing to cancel first (an issue created with an assignee or assigned,
    an agent session `created`) is first tried as one statement that is its own transaction
    (`_start_at_once`): its first round. Only when that writes nothing (an issue with an undelivered
    dispatch to cancel, among other reasons) is it decided in the transaction. A follow-up in an
    agent session a machine holds is tried the same way (`_prompt_at_once`).

    Webhooks of one issue, or of one agent session, are handled one at a time in arrival order in
    this process (`shared.in_order`): one waiting in a group commit's line holds no turn yet, and a
    later one of the same key must not overtake it."""
    plan = intent(hook, own_client_id)
    key, content_key = hook.delivery_keys(delivery)
    with IN_ORDER.place(_order_key(hook, plan)):
        return _receive_in_order(pool, hook, plan, key, content_key)


# Within this process, webhooks of one issue or agent session in arrival order (`shared.in_order`).
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


def _receive_in_order(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    if _does_nothing(hook, plan):
        ignored = _ignore_at_once(pool, plan, key, content_key)
        if ignored is not None:
            return ignored
        # (Seen before: the transaction below answers `duplicate`, with the session it made.)
    rounds = ROUNDS
    start = _start_alone(hook, plan, key, content_key)
    if start is not None:
        done = _start_at_once(pool, start)
        if done is not None:
            return done
        rounds -= 1  # (a round that wrote nothing; `_start_at_once` says when)
    elif _prompt_alone(hook, plan):
        done = _prompt_at_once(pool, hook, plan, key, content_key)
        if done is not None:
            return done
        # (Not a round: it wrote nothing mostly because nobody holds the agent session yet.)
    for _ in range(rounds - 1):
        try:
            return _receive(pool, hook, plan, key, content_key)
        except MachineRevoked:
            continue
    return _receive(pool, hook, plan, key, content_key)


ROUNDS = 3


def _prompt_alone(hook: Webhook, plan: Intent) -> bool:
    """A follow-up (`prompted`, not a stop) that may go straight to the machine holding its agent
    session: its one statement finds out, and writes nothing when it cannot."""
    return (
        plan.kind == "prompt"
        and hook.org_id is not None
        and plan.agent_session_id is not None
        and plan.issue is not None
    )


def _prompt_at_once(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received | None:
    """The follow-up as one statement, its own transaction (`prompt_holders`), through the pool's
    group commit of follow-ups: one round trip where the transaction below takes four. None: it
    wrote nothing (see `prompt_holders`)."""
    assert hook.org_id is not None and plan.issue is not None
    message = DispatchPayload(
        issue=plan.issue, agent_session_id=plan.agent_session_id, kind="prompt", prompt=plan.prompt
    )
    follow_up = FollowUp(hook.org_id, plan.user_id, message, key, content_key, plan.activity_at)
    routed = _follow_ups(pool).submit(follow_up)
    if routed is None:
        return None
    return Received(_dispatched(routed.enqueued, routed.orchestrator_id, "prompt"), recorded=True)


def _start_alone(hook: Webhook, plan: Intent, key: str, content_key: str) -> Start | None:
    """A start for a user's machine that may have nothing to cancel first: an issue created with an
    assignee or assigned (its one statement finds out, and writes nothing when it has), or an agent
    session `created`. None for any other event."""
    if plan.kind != "dispatch" or hook.org_id is None or plan.issue is None or plan.user_id is None:
        return None
    if plan.cancel_issue_id not in (None, plan.issue.id):
        return None
    message = DispatchPayload(
        issue=plan.issue, agent_session_id=plan.agent_session_id, kind="start", prompt=plan.prompt
    )
    return Start(hook.org_id, plan.user_id, message, key, content_key, plan.event_at)


def _start_at_once(pool: Pool, start: Start) -> Received | None:
    """The start as one statement, its own transaction: the delivery recorded, the agent session's
    turn taken, the machine chosen and the message queued (with Linear's first notice) in one round
    trip, where the transaction below takes four. None: it wrote nothing (a delivery seen before,
    the machine chosen revoked meanwhile, an agent session's user without a machine, or an issue
    with an undelivered dispatch to cancel first or whose turn another transaction has).

    Starts go through the pool's group commit (`_group_commit`): starts that arrive while another
    batch is being written are written together, in one statement and one commit (issues with
    issues, agent sessions with agent sessions)."""
    routed = _group_commit(pool, start.message.agent_session_id is not None).submit(start)
    if routed is None:
        return None
    if routed == NO_MACHINE:
        # As the transaction below answers it: most assignments in a workspace go to people
        # without a machine, and Linear is not told about a plain issue.
        return Received({"status": "ignored", "reason": "no_orchestrator"}, recorded=True)
    enq = routed.enqueued
    answer = _dispatched(enq, routed.orchestrator_id, "start" if start.message.agent_session_id else None)
    return Received(answer, _notices(enq), recorded=True)


BATCH = 64  # the most webhooks written in one statement
# Batches of one kind (issues' starts, agent sessions' starts, follow-ups, edits) written at once.
# With one, every caller waited for the batch ahead of it to commit (its WAL flush) while the cores
# idled; with two, the next batch is written meanwhile (+26 % existing issues assigned, median of 8
# alternating pairs; three or four were no faster). Two batches holding one issue, or one agent
# session, are kept apart by its turn, which each statement tries without waiting
# (`devpilot_issue_turn_free`; `free` in the agent sessions'; `devpilot_agent_session_holder` for
# the follow-ups').
LANES = 2
_COMBINERS: weakref.WeakKeyDictionary[Pool, dict[str, Combiner[Any, Any]]] = weakref.WeakKeyDictionary()
_COMBINERS_LOCK = threading.Lock()


def _combiner(
    pool: Pool,
    name: str,
    many: Callable[[Pool, list[Any]], list[Any]],
    one: Callable[[Pool, Any], Any] | None = None,
) -> Combiner[Any, Any]:
    """The pool's group commit called `name` (one per pool and name, made on first use). `one`:
    how an item alone is written, when not as a batch of one."""
    with _COMBINERS_LOCK:
        kinds = _COMBINERS.get(pool)
        if kinds is None:
            kinds = _COMBINERS[pool] = {}
        combiner = kinds.get(name)
        if combiner is None:
            alone = None if one is None else partial(one, pool)
            combiner = kinds[name] = Combiner(partial(many, pool), alone, BATCH, LANES)
        return combiner


def _group_commit(pool: Pool, agent_sessions: bool) -> Combiner[Start, RouteOutcome]:
    """The pool's group commit of issues' starts, or of agent sessions'. A start alone is written by
    `_one_statement`: an agent session's then waits for its turn, as the intake transaction does.
    Copies of one delivery in one batch are answered None by `route_and_enqueue_many`: each goes
    on to the intake transaction, which finds the first copy's record and answers `duplicate`."""
    return _combiner(pool, "agent_sessions" if agent_sessions else "issues", _starts, _one_statement)


def _starts(pool: Pool, starts: list[Start]) -> list[RouteOutcome]:
    with statement(pool) as tx:
        return route_and_enqueue_many(tx, starts)


def _follow_ups(pool: Pool) -> Combiner[FollowUp, Routed | None]:
    """The pool's group commit of follow-ups for the machines that hold their agent sessions (one
    statement alone, or several together: `prompt_holders` never waits for a turn)."""
    return _combiner(pool, "follow_ups", _prompts)


def _prompts(pool: Pool, follow_ups: list[FollowUp]) -> list[Routed | None]:
    with statement(pool) as tx:
        return prompt_holders(tx, follow_ups)


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


def _does_nothing(hook: Webhook, plan: Intent) -> bool:
    """The event is ignored and Linear is not told (`_apply`'s first branch, less an agent session
    that nothing can take, which Linear hears about)."""
    return plan.kind == "ignore" and not (hook.org_id and plan.unroutable_notice and plan.agent_session_id)


def _ignore_at_once(pool: Pool, plan: Intent, key: str, content_key: str) -> Received | None:
    """The delivery recorded as ignored in one statement that is its own transaction (through the
    pool's group commit of such deliveries), where the transaction below takes four round trips
    (BEGIN, record, its outcome, COMMIT). None: it was seen before, and nothing was written."""
    if not _ignored_deliveries(pool).submit((key, content_key)):
        return None
    return Received(_ignored(plan), recorded=True)


def _ignored_deliveries(pool: Pool) -> Combiner[tuple[str, str], bool]:
    """The pool's group commit of deliveries that do nothing: each recorded (True) or seen before."""
    return _combiner(pool, "ignored", record_ignored)


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


def _receive(pool: Pool, hook: Webhook, plan: Intent, key: str, content_key: str) -> Received:
    keys = {"key": key, "content_key": content_key}
    routing = plan.kind in ("dispatch", "prompt") and plan.issue is not None and hook.org_id is not None
    # The events of one agent session that do something take turns (`agent_session_turn`), and so
    # do the assignment events of one issue (`issue_turn`: a cancel is decided, and the group
    # commit's statement tries the same turn).
    turn = hook.org_id is not None and plan.kind not in ("ignore", "disconnect")
    # (an issue's assignment event, ordered by Linear's time of the change: its issue's turn)
    issue = plan.issue.id if plan.event_at is not None and plan.issue is not None else plan.cancel_issue_id
    issue_turn = issue if turn and plan.agent_session_id is None else None
    with transaction(pool) as tx:
        recorded = tx.one(
            query("record_delivery"),
            {
                **keys,
                "org_id": hook.org_id,
                "route_user": plan.user_id if routing else None,
                "agent_session_id": plan.agent_session_id if turn else None,
                "issue_id": issue_turn,
                "event_at": plan.event_at if issue_turn is not None else None,
                # (an agent session `created`: may it still start?)
                "created": turn and plan.kind == "dispatch" and plan.agent_session_id is not None,
                # (a follow-up: was it written before a stop of its agent session?)
                "prompt_at": plan.activity_at if turn and plan.kind == "prompt" else None,
            },
        )
        if recorded is None:
            seen = tx.one(query("delivery_session"), keys)
            sid = seen["session_id"] if seen else None
            return Received({"status": "duplicate", "sessionId": str(sid) if sid else None})
        # Handled after a later change it would undo (Linear's retry of a delivery that failed, or
        # one that reached another instance first): an assignment older than a change of its issue
        # handled already, an agent session `created` after its stop or its first follow-up, or a
        # follow-up written before a stop of its agent session.
        if recorded["superseded"]:
            received = Received({"status": "ignored", "reason": "assignment_superseded"})
        elif recorded["seen"] is not None:
            received = Received({"status": "ignored", "reason": f"agent_session_{recorded['seen']}"})
        else:
            received = _apply(tx, hook, plan, recorded["routed"], key, mixed=recorded["mixed"])
        if not received.recorded:
            tx.execute(
                query("finish_delivery"),
                {
                    **keys,
                    "session_id": received.answer.get("sessionId"),
                    "outcome": received.answer["status"],
                },
            )
        return received


def _apply(
    tx: Tx, hook: Webhook, plan: Intent, routed: UUID | None, key: str, *, mixed: bool = False
) -> Received:
    """What the event does, in the intake transaction. `routed`: the machine the routing policy
    chose for the plan's user (chosen by `record_delivery`), or None; `key`: the delivery's key;
    `mixed`: the user's machines differ in what they have, so a start needs its repository first."""
    org = hook.org_id
    if org is None or plan.kind == "ignore":
        if org and plan.unroutable_notice and plan.agent_session_id:
            return Received(
                {"status": "ignored", "reason": plan.reason}, _tell(tx, org, plan, "failed", UNROUTABLE)
            )
        return Received(_ignored(plan))
    if plan.kind == "disconnect":  # the app was uninstalled: posts wait for a new install
        linear_auth.disconnect(tx, org, "the app was uninstalled from the workspace (OAuthApp revoked)")
        return Received({"status": "ignored", "reason": plan.reason})
    if plan.kind == "stop":
        return _stop(tx, org, plan)
    if plan.kind == "prompt":
        holder = _holder(tx, org, plan.agent_session_id, delivered_only=False)
        if holder is not None:
            return _dispatch(
                tx,
                org,
                plan,
                holder.orchestrator_id,
                plan.issue or holder.issue,
                "prompt",
                [],
                key,
                speaks_as=holder.speaks_as,
            )
        answered = _answer(tx, org, plan)
        if answered is not None:
            return answered
    if (
        plan.kind in ("dispatch", "prompt")
        and plan.agent_session_id is not None
        and plan.issue is not None
        and (plan.user_id is None or routing.waiting(tx, org, plan.agent_session_id))
    ):
        # Linear must be asked whose machine takes it (no creator), or an earlier message of the
        # conversation is still waiting for that answer: routed after the commit, in order.
        return _route_later(tx, org, plan, key, "assignee" if plan.user_id is None else "repository")

    cancelled: list[UUID] = []
    if plan.cancel_issue_id:
        cancelled = cancel_issue(
            tx,
            org_id=org,
            issue_id=plan.cancel_issue_id,
            reason=f"issue {hook.action}: assignment changed" if hook.action == "update" else "issue removed",
        )
    if plan.kind in ("dispatch", "prompt") and plan.issue and plan.user_id and routed is not None:
        if mixed:  # which of the user's machines depends on the repository: Linear is asked first
            return _route_later(tx, org, plan, key, "repository", cancelled)
        return _dispatch(tx, org, plan, routed, plan.issue, "start", cancelled, key)
    if cancelled:
        return Received({"status": "cancelled", "sessionId": str(cancelled[0])})
    if plan.kind == "cancel":
        return Received({"status": "ignored", "reason": "nothing_to_cancel"})
    # Unroutable. A plain assignment to someone without a machine is most assignments in a
    # workspace: nothing is posted. An agent session is waiting on us: Linear hears why.
    told = (
        _tell(tx, org, plan, "failed", UNROUTABLE) if plan.unroutable_notice and plan.agent_session_id else []
    )
    return Received({"status": "ignored", "reason": "no_orchestrator"}, told)


def _dispatch(
    tx: Tx,
    org: str,
    plan: Intent,
    orch: UUID,
    issue: IssueRef,
    kind: MessageKind,
    cancelled: list[UUID],
    delivery_key: str | None,
    *,
    speaks_as: str | None = None,
) -> Received:
    """Queue the message, and (with `delivery_key`, when this is the webhook's answer) record the
    delivery as dispatched to it in the same statement. `speaks_as`: the name the machine knows the
    agent session by (one devpilot opened for a plain assignment), given in the message instead."""
    prompt = plan.prompt if kind != "stop" else None
    enq = enqueue_dispatch(
        tx,
        org_id=org,
        orchestrator_id=orch,
        linear_user_id=plan.user_id,
        message=DispatchPayload(
            issue=issue, agent_session_id=plan.agent_session_id, kind=kind, prompt=prompt
        ),
        delivery_key=delivery_key,
        # Linear's first activity for a new agent session, written by the enqueue's own statement.
        notice_queued=bool(plan.agent_session_id) and kind == "start" and delivery_key is not None,
        speaks_as=speaks_as,
    )
    answer = _dispatched(enq, orch, kind if plan.agent_session_id else None)
    if cancelled:
        answer["cancelledSessionId"] = str(cancelled[0])
    return Received(answer, _notices(enq), recorded=delivery_key is not None)


def _route_later(
    tx: Tx, org: str, plan: Intent, key: str, need: str, cancelled: list[UUID] | None = None
) -> Received:
    """A start (or a follow-up behind one) routed after the commit, once Linear has been asked
    (`need`: whose machine, or which of the user's machines has the issue's repository)."""
    assert plan.issue is not None
    message = DispatchPayload(
        issue=plan.issue,
        agent_session_id=plan.agent_session_id,
        kind="start" if plan.kind == "dispatch" else "prompt",
        prompt=plan.prompt,
    )
    user = plan.user_id if need == "repository" else None
    rid = routing.request(tx, org_id=org, message=message, delivery_key=key, need=need, linear_user_id=user)
    answer: dict[str, Any] = {"status": "routing", "routeId": str(rid)}
    if cancelled:
        answer["cancelledSessionId"] = str(cancelled[0])
    return Received(answer, route_ids=[rid])


def _answer(tx: Tx, org: str, plan: Intent) -> Received | None:
    """A `prompted` with the `select` signal in an agent session that was asked which repository
    (and that no machine holds yet): the person's pick completes the waiting routing request, which
    is routed after the commit. None: nothing was asked (the choice answers the agent)."""
    prompt = plan.prompt
    if prompt is None or prompt.signal != "select" or plan.agent_session_id is None:
        return None
    meta = prompt.signal_metadata or {}
    picked = prompt.body or str(meta.get("value") or meta.get("label") or "")
    rid = routing.answer(tx, org, plan.agent_session_id, picked)
    if rid is None:
        return None
    return Received({"status": "routing", "routeId": str(rid)}, route_ids=[rid])


def _stop(tx: Tx, org: str, plan: Intent) -> Received:
    """Linear's stop signal: cancel what no machine has yet (queued messages, and messages still
    waiting to be routed), and tell the machine that has it."""
    assert plan.agent_session_id is not None
    routing.cancel(tx, org, plan.agent_session_id)
    rows = tx.all(
        query("cancel_agent_session"),
        {"org_id": org, "agent_session_id": plan.agent_session_id, "reason": "stopped in Linear"},
    )
    cancelled = [str(r["id"]) for r in rows]
    # After the cancel: a release or the sweep that dead-lettered one of its messages meanwhile
    # (a follow-up's, without the turn) held that row, the cancel waited for it, and this statement,
    # with a snapshot taken after, marks its dead letter too (`record_stop`).
    tx.execute(
        query("record_stop"),
        {"org_id": org, "agent_session_id": plan.agent_session_id, "at": plan.activity_at},
    )
    holder = _holder(tx, org, plan.agent_session_id, delivered_only=True)
    if holder is None:
        told = _tell(tx, org, plan, "stopped", STOPPED_BEFORE_START)
        return Received({"status": "stopped", "cancelledSessionIds": cancelled, "stopSessionId": None}, told)
    sent = _dispatch(
        tx,
        org,
        plan,
        holder.orchestrator_id,
        plan.issue or holder.issue,
        "stop",
        [],
        None,
        speaks_as=holder.speaks_as,
    )
    answer = {
        "status": "stopped",
        "cancelledSessionIds": cancelled,
        "stopSessionId": sent.answer["sessionId"],
    }
    return Received(answer, sent.notice_ids)


@dataclass(frozen=True)
class Holder:
    orchestrator_id: UUID
    issue: IssueRef
    speaks_as: str | None  # an agent session devpilot opened: the name its machine knows it by


def _holder(tx: Tx, org: str, agent_session_id: str | None, *, delivered_only: bool) -> Holder | None:
    row = tx.one(
        query("agent_session_holder"),
        {"org_id": org, "agent_session_id": agent_session_id, "delivered_only": delivered_only},
    )
    if row is None:
        return None
    issue = IssueRef(id=row["issue_id"] or "", identifier=row["issue_identifier"])
    opened = f"devpilot:{row['opened_for']}" if row["opened_for"] is not None else None
    return Holder(row["orchestrator_id"], issue, opened)


def _tell(tx: Tx, org: str, plan: Intent, kind: str, body: str) -> list[UUID]:
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
