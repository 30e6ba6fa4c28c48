"""A page per session, the search that finds it, and what operators do to a session.

- `read`: the session, its machine, every message of its conversation in order (when each was
  queued, claimed, acked; each attempt that ended without an ack and its error; the dead letter),
  every post to Linear about it (queued, sent, retried, given up with Linear's answer), and the
  operators' actions on it.
- `retry` (a failed session: its dead letter's message in a new queue row, attempts from 0, on its
  machine, or routed again when that one is revoked), `cancel` (a queued session) and `move` (an
  unclaimed start, to another active machine of the same user): each one transaction that locks
  the session, makes its queue write through `shared.delivery.queue` (the queue's owner: it keeps the
  invariant, a session is `queued` exactly while one queue row holds it, and writes what Linear
  hears) and records who did it; `NotAllowed` when the session's state does not allow it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from shared.delivery import queue
from shared.delivery.queue import wait_for_turn
from shared.plumbing.db import Pool, Tx, lend, transaction
from shared.plumbing.sql import query

SEARCH_LIMIT = 50


class NotAllowed(Exception):
    """The session's state does not allow the action (the contract's `409 not_allowed`)."""


class NotFound(Exception):
    """No such session."""


@dataclass(frozen=True)
class Acted:
    status: str  # the session's status after the action
    detail: str  # what was done, as recorded
    notice_ids: list[UUID] = field(default_factory=list)


@dataclass
class Page:
    session: dict[str, Any]
    messages: list[dict[str, Any]]
    attempts: dict[UUID, list[dict[str, Any]]]
    posts: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    machines: list[dict[str, Any]]  # where a move may send it


def read(pool: Pool, session_id: UUID) -> Page | None:
    with lend(pool) as conn:
        head = conn.execute(query("session_header"), {"id": session_id}).fetchone()
        if head is None:
            return None
        session = dict(head)
        params = {
            "id": session_id,
            "org_id": session["org_id"],
            "agent_session_id": session["agent_session_id"],
        }
        messages = [dict(r) for r in conn.execute(query("session_conversation"), params)]
        ids = [m["id"] for m in messages]
        attempts: dict[UUID, list[dict[str, Any]]] = {}
        for r in conn.execute(query("session_attempts"), {"ids": ids}):
            attempts.setdefault(r["session_id"], []).append(dict(r))
        agents = [f"devpilot:{i}" for i in ids]
        if session["agent_session_id"]:
            agents.append(session["agent_session_id"])
        posts = [
            dict(r)
            for r in conn.execute(
                query("session_posts"), {"org_id": session["org_id"], "agent_sessions": agents, "ids": ids}
            )
        ]
        actions = [dict(r) for r in conn.execute(query("session_actions_list"), {"ids": ids})]
        machines = [
            dict(r)
            for r in conn.execute(query("session_machines"), {"orchestrator_id": session["orchestrator_id"]})
        ]
    return Page(session, messages, attempts, posts, actions, machines)


def search(pool: Pool, text: str | None, limit: int = SEARCH_LIMIT) -> list[dict[str, Any]]:
    q = (text or "").strip() or None
    try:
        as_id = UUID(q) if q else None
    except ValueError:
        as_id = None
    with lend(pool) as conn:
        return [dict(r) for r in conn.execute(query("session_search"), {"q": q, "id": as_id, "limit": limit})]


def machine_named(pool: Pool, name: str) -> UUID:
    """The active machine a person names (its name, or its id); NotAllowed when none or several."""
    with lend(pool) as conn:
        rows = conn.execute(query("machine_by_name"), {"name": name}).fetchall()
    if len(rows) != 1:
        raise NotAllowed(f"no single active machine named {name!r}")
    return UUID(str(rows[0]["id"]))


def _locked(tx: Tx, session_id: UUID, *, turn: bool = False) -> dict[str, Any]:
    """The session, locked, its queue row first (`session_queue_lock`). `turn`: its agent session's
    turn before both (`session_turn_peek`), for an action that takes the messages queued behind a
    start, or that decides on what its conversation did since. The order the webhooks and the ack
    take them in."""
    if turn:
        wait_for_turn(tx, "session_turn_peek", {"id": session_id})
    tx.execute(query("session_queue_lock"), {"id": session_id})  # (the queue row before the session's)
    row = tx.one(query("session_lock"), {"id": session_id})
    if row is None:
        raise NotFound(str(session_id))
    return dict(row)


def _record(tx: Tx, session_id: UUID, action: str, actor: str, detail: str) -> None:
    tx.execute(
        query("session_action_record"), {"id": session_id, "action": action, "actor": actor, "detail": detail}
    )


def retry(pool: Pool, session_id: UUID, actor: str) -> Acted:
    """A failed session queued again: the same message, attempts from 0, on its machine, or (a
    start whose machine is revoked) on its user's most recently seen active machine. A message of
    an agent session is retried with its turn held, and only while that does not undo or fork what
    its conversation did since (`retry_overtaken`): not after the person stopped it, a start not
    once another machine has the conversation, a follow-up only on the machine that has it."""
    with transaction(pool) as tx:
        s = _locked(tx, session_id, turn=True)
        if s["status"] != "failed":
            raise NotAllowed(f"only a failed session can be retried; this one is {s['status']}")
        if s["machine_revoked_at"] is not None and s["kind"] != "start":
            raise NotAllowed(
                "its machine was revoked, and a follow-up goes only to its conversation's machine"
            )
        _check_conversation(tx, session_id, s)
        machine = s["orchestrator_id"]
        if s["machine_revoked_at"] is not None:
            routed = tx.one(
                query("routed_machine"),
                {"org_id": s["org_id"], "route_user": s["linear_user_id"] or s["machine_user"]},
            )
            if routed is None:
                raise NotAllowed("its machine was revoked and its user has no other active machine")
            machine = routed["id"]
        requeued = queue.requeue_failed(tx, session_id, machine)
        if requeued is None:
            raise NotAllowed("no dead letter to queue again, or its machine was revoked meanwhile")
        detail = f"queued again on {requeued.machine}"
        _record(tx, session_id, "retry", actor, detail)
    return Acted("queued", detail, requeued.notice_ids)


def _check_conversation(tx: Tx, session_id: UUID, s: dict[str, Any]) -> None:
    """NotAllowed when retrying this failed message would undo or fork what its agent session's
    conversation did since it failed (`retry_overtaken`; read with the turn held)."""
    seen = tx.one(query("retry_overtaken"), {"id": session_id})
    if seen is None:
        return  # (no agent session: a plain issue's start)
    if seen["stopped"]:
        raise NotAllowed("its agent session was stopped in Linear after it failed")
    if s["kind"] == "start" and seen["holder"] is not None:
        raise NotAllowed(
            "its conversation went on without it (a later message of its agent session is queued"
            " or delivered): a retry would start it a second time"
        )
    if s["kind"] != "start" and seen["holder"] != s["orchestrator_id"]:
        raise NotAllowed(
            "no machine has its conversation, or another machine has it: retry the start of its"
            " conversation first"
        )


def cancel(pool: Pool, session_id: UUID, actor: str) -> Acted:
    """A queued session cancelled (with, for a start, what its conversation queued behind it)."""
    with transaction(pool) as tx:
        s = _locked(tx, session_id, turn=True)
        if s["status"] != "queued":
            raise NotAllowed(f"only a queued session can be cancelled; this one is {s['status']}")
        cancelled = queue.cancel_queued(tx, session_id, f"cancelled by {actor}")
        if not cancelled.cancelled:
            raise NotAllowed("it was delivered meanwhile")
        behind = cancelled.behind
        detail = "cancelled" + (f", with {behind} message(s) queued behind it" if behind else "")
        _record(tx, session_id, "cancel", actor, detail)
    return Acted("cancelled", detail, cancelled.notice_ids)


def move(pool: Pool, session_id: UUID, target: UUID, actor: str) -> Acted:
    """An unclaimed start moved to another active machine of the same user (with the messages of
    its conversation queued behind it)."""
    with transaction(pool) as tx:
        s = _locked(tx, session_id, turn=True)
        if s["status"] != "queued" or s["kind"] != "start":
            raise NotAllowed(f"only a queued start can be moved; this one is a {s['status']} {s['kind']}")
        target_name = queue.move_start(tx, session_id, s["orchestrator_id"], target)
        if target_name is None:
            raise NotAllowed("it is claimed, or the target is not another active machine of the same user")
        detail = f"moved to {target_name}"
        _record(tx, session_id, "move", actor, detail)
    return Acted("queued", detail)
