"""Webhooks as the intake hands them to its group commits (`shared.delivery.intake`): issues'
assignment changes (`_issue_changes`) and stops (`_stop_agent_sessions`), without HTTP, so a test
can put several in one batch, or race one against another transaction."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

from shared.delivery import intake
from shared.delivery.models import DispatchPayload
from shared.delivery.queue import SUPERSEDED, IssueChange, IssueChanged
from shared.linear.webhooks import parse, what_it_asks
from shared.plumbing.db import Pool
from shared.wire.messages import IssueRef
from tests.helpers.api import issue_event


def assigned(issue_id: str, user: str | None, before: str, org: str = "org-a") -> dict[str, Any]:
    """An existing issue assigned to `user` (None: unassigned); its assignee was `before`."""
    return issue_event(
        "update", org=org, issue_id=issue_id, assignee=user, updated_from={"assigneeId": before}
    )


def change_of(payload: dict[str, Any], delivery: str) -> IssueChange:
    """The assignment change a webhook asks for, as the intake hands it to the group commit
    (`_issue_change`)."""
    hook = parse(json.dumps(payload).encode())
    ask = what_it_asks(hook)
    plan = ask.plan
    assert hook.org_id is not None and plan.cancel_issue_id is not None
    key, content_key = hook.delivery_keys(delivery)
    if ask.kind == "cancel":  # (an unassignment: the cancel alone)
        return IssueChange(
            hook.org_id, plan.cancel_issue_id, key, content_key, plan.event_at, intake._why(hook)
        )
    assert ask.kind == "cancel_and_start" and plan.issue is not None
    start = DispatchPayload(issue=plan.issue, agent_session_id=None, kind="start", prompt=plan.prompt)
    return IssueChange(
        hook.org_id, plan.issue.id, key, content_key, plan.event_at, intake._why(hook), plan.user_id, start
    )


def changes_answered(pool: Pool, changes: list[IssueChange]) -> list[intake.Received | None]:
    """Assignment changes written as one batch of the group commit (`_issue_changes_written`), each
    answered as the intake answers it; None: nothing written (seen before, or to write again)."""
    outcomes = intake._issue_changes_written(pool, changes)
    return [
        intake._changed(pool, c, o) if isinstance(o, IssueChanged) or o == SUPERSEDED else None
        for c, o in zip(changes, outcomes, strict=True)
    ]


def unassign(pool: Pool, org_id: str, issue_id: str) -> dict[str, Any]:
    """The issue unassigned, alone in its transaction: the answer (`cancelled` with the session
    cancelled, or `ignored`: nothing to cancel)."""
    [done] = changes_answered(pool, [change_of(assigned(issue_id, None, "user-1", org_id), f"un-{uuid4()}")])
    assert done is not None
    return done.answer


def stop_of(payload: dict[str, Any], delivery: str) -> intake.Stop:
    """The stop a webhook asks for (an agent session's `prompted` with the stop signal), as the
    intake hands it to the group commit of stops (`_stop`)."""
    hook = parse(json.dumps(payload).encode())
    plan = what_it_asks(hook).plan
    org, agent_session = hook.org_id, plan.agent_session_id
    assert plan.kind == "stop" and org is not None and agent_session is not None
    message = DispatchPayload(
        issue=plan.issue or IssueRef(id=""), agent_session_id=agent_session, kind="stop", prompt=None
    )
    record = intake._record_params(hook, plan, *hook.delivery_keys(delivery))
    return intake.Stop(org, agent_session, record, plan, message)
