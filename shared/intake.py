"""Webhook intake: one transaction records the delivery, any cancellation and any new dispatch.

Either all of it commits (delivery id, cancelled session, new session and its queue row) or none
of it does, so a crash mid-request leaves Linear's retry to find nothing recorded and try again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from shared import notices as notices_mod
from shared.db import Pool, Tx, transaction
from shared.linear import Intent, Webhook, intent
from shared.models import DispatchPayload
from shared.queue import cancel_issue, create_session, enqueue_dispatch
from shared.routing import route
from shared.sql import query


@dataclass(frozen=True)
class Received:
    answer: dict[str, Any]  # the contract's answer body
    notice_ids: list[UUID] = field(default_factory=list)  # Linear notices written, to send after commit


def receive(pool: Pool, hook: Webhook, delivery_key: str) -> Received:
    """Apply one verified, fresh webhook in one transaction."""
    plan = intent(hook)
    with transaction(pool) as tx:
        if tx.one(query("record_delivery"), {"key": delivery_key}) is None:
            seen = tx.one(query("delivery_session"), {"key": delivery_key})
            sid = seen["session_id"] if seen else None
            return Received({"status": "duplicate", "sessionId": str(sid) if sid else None})

        received = _apply(tx, hook, plan)
        tx.execute(
            query("finish_delivery"),
            {
                "key": delivery_key,
                "session_id": received.answer.get("sessionId"),
                "outcome": received.answer["status"],
            },
        )
        return received


def _apply(tx: Tx, hook: Webhook, plan: Intent) -> Received:
    assert hook.org_id is not None or plan.kind == "ignore"
    notices: list[UUID] = []
    cancelled: list[UUID] = []
    if plan.cancel_issue_id and hook.org_id:
        cancelled = cancel_issue(
            tx,
            org_id=hook.org_id,
            issue_id=plan.cancel_issue_id,
            linear_user_id=None,
            reason=f"issue {hook.action}: assignment changed" if hook.action == "update" else "issue removed",
        )
    if plan.kind == "dispatch" and hook.org_id and plan.issue and plan.user_id:
        orch = route(tx, org_id=hook.org_id, linear_user_id=plan.user_id)
        if orch is not None:
            sid = create_session(
                tx,
                org_id=hook.org_id,
                orchestrator_id=orch,
                linear_user_id=plan.user_id,
                issue=plan.issue,
                agent_session_id=plan.agent_session_id,
            )
            enq = enqueue_dispatch(
                tx,
                org_id=hook.org_id,
                orchestrator_id=orch,
                session_id=sid,
                message=DispatchPayload(issue=plan.issue, agent_session_id=plan.agent_session_id),
            )
            if plan.agent_session_id:
                row = tx.one(
                    query("notice_dispatched"),
                    {
                        "org_id": hook.org_id,
                        "session_id": sid,
                        "agent_session_id": plan.agent_session_id,
                        "issue_id": plan.issue.id,
                        "orchestrator_id": orch,
                    },
                )
                if row is not None:
                    notices.append(row["id"])
            answer: dict[str, Any] = {
                "status": "dispatched",
                "sessionId": str(sid),
                "queueId": str(enq.queue_id),
                "messageId": str(enq.message_id),
                "orchestratorId": str(orch),
            }
            if cancelled:
                answer["cancelledSessionId"] = str(cancelled[0])
            return Received(answer, notices)
        if not cancelled:
            # Unroutable: tell the user in Linear that no machine is there to take it.
            nid = notices_mod.write(
                tx,
                org_id=hook.org_id,
                kind="failed",
                session_id=None,
                agent_session_id=plan.agent_session_id,
                issue_id=plan.issue.id,
                body="No machine is registered for you in devpilot; nothing was dispatched.",
            )
            return Received({"status": "ignored", "reason": "no_orchestrator"}, [] if nid is None else [nid])
    if cancelled:
        return Received({"status": "cancelled", "sessionId": str(cancelled[0])})
    if plan.kind == "cancel":
        return Received({"status": "ignored", "reason": "nothing_to_cancel"})
    return Received({"status": "ignored", "reason": plan.reason or "not_routable"})
