"""Linear webhooks: signature, freshness, and what an event asks of us.

Linear signs the raw body with HMAC-SHA256 under the webhook's signing secret and sends the
lowercase hex digest in `Linear-Signature`; its SDK compares in constant time, and so do we.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

from shared.plumbing import jsoninput
from shared.wire.messages import IssueRef, Prompt


class BadWebhook(ValueError):
    """The body is not a webhook we can read; answered 400 bad_request."""


def signature_ok(secret: str, body: bytes, signature: str | None) -> bool:
    """Any header value at all (non-ASCII, huge, empty) is compared as bytes: a mismatch, never an
    exception (compare_digest refuses non-ASCII str)."""
    if not signature:
        return False
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, signature.strip().encode("utf-8", "surrogateescape"))


def signed_by_any(secrets: list[str], body: bytes, signature: str | None) -> bool:
    """Whether any of the secrets signed the body. Every secret is compared, whichever matches
    first, so the time taken says nothing about which one did (or that one nearly did)."""
    matches = [signature_ok(secret, body, signature) for secret in secrets]
    return any(matches)


def sign(secret: str, body: bytes) -> str:
    """What Linear would send in Linear-Signature (tests, demo)."""
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Webhook:
    raw: dict[str, Any]
    type: str
    action: str
    timestamp_ms: int
    org_id: str | None
    entity: dict[str, Any]

    def delivery_keys(self, delivery_header: str | None) -> tuple[str, str]:
        """What identifies this delivery: its Linear-Delivery id (the content key when none is
        sent) and its content, so the same change arriving through two webhooks (workspace and
        app), or replayed under a new delivery id, is one delivery."""
        content = "content:" + json.dumps(self.content_identity(), separators=(",", ":"))
        if delivery_header and delivery_header.strip():
            return "delivery:" + delivery_header.strip(), content
        return content, content

    def content_identity(self) -> list[Any]:
        parts: list[Any] = [self.org_id, self.type, self.action, self.entity.get("id")]
        if self.type == "AgentSessionEvent":
            activity = self.raw.get("agentActivity")
            return [*parts, activity.get("id") if isinstance(activity, dict) else None]
        if self.type in ENTITYLESS:
            return [*parts, self.raw.get("createdAt"), self.timestamp_ms]
        return [*parts, self.entity.get("updatedAt")]


def parse(body: bytes) -> Webhook:
    try:
        raw = jsoninput.load(body)
    except jsoninput.BadJson as exc:
        raise BadWebhook(str(exc)) from None
    if not isinstance(raw, dict):
        raise BadWebhook("body must be a JSON object")
    for field in ("type", "action"):
        if not isinstance(raw.get(field), str) or not raw[field]:
            raise BadWebhook(f"'{field}' must be a non-empty string")
    ts = raw.get("webhookTimestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
        raise BadWebhook("'webhookTimestamp' must be a number (ms since epoch)")
    entity_field = "agentSession" if raw["type"] == "AgentSessionEvent" else "data"
    entity = raw.get(entity_field, {} if raw["type"] in ENTITYLESS else None)
    if not isinstance(entity, dict):
        raise BadWebhook(f"'{entity_field}' must be an object for a {raw['type']} event")
    org = raw.get("organizationId")
    if org is not None and not isinstance(org, str):
        raise BadWebhook("'organizationId' must be a string")
    return Webhook(raw, raw["type"], raw["action"], int(ts), org, entity)


# Events about the app itself, with no entity object (OAuthAppWebhookPayload).
ENTITYLESS = ("OAuthApp",)


def is_fresh(hook: Webhook, now_ms: int, tolerance_seconds: int) -> bool:
    return abs(now_ms - hook.timestamp_ms) <= tolerance_seconds * 1000


@dataclass(frozen=True)
class Intent:
    """What the event asks: dispatch a start to a user, a follow-up or a stop in an agent session,
    cancel the issue's open assignment dispatch, or nothing. A start of an agent session whose user
    the webhook does not name (started by an automation) is a `dispatch` with no `user_id`: Linear
    must be asked for the issue's assignee first (after the webhook's transaction)."""

    kind: Literal["dispatch", "cancel", "prompt", "stop", "disconnect", "ignore"]
    reason: str = ""
    issue: IssueRef | None = None
    user_id: str | None = None  # the Linear user whose orchestrator takes it
    cancel_issue_id: str | None = None  # cancel this issue's open dispatch first
    agent_session_id: str | None = None
    prompt: Prompt | None = None
    unroutable_notice: bool = False  # tell Linear when nothing can take it (agent sessions only)
    # An issue's assignment event (created with an assignee, assignee changed): when Linear made the
    # change (`updatedAt`). One older than a change already handled for the issue does nothing.
    event_at: datetime | None = None
    # A `prompted` (a follow-up, or a stop): when the person wrote it (`agentActivity.createdAt`). A
    # follow-up written before a stop of its agent session that was handled already does nothing.
    activity_at: datetime | None = None


def _str(d: dict[str, Any], key: str) -> str | None:
    v = d.get(key)
    return v if isinstance(v, str) and v else None


def _issue(d: dict[str, Any]) -> IssueRef | None:
    issue_id = _str(d, "id")
    if issue_id is None:
        return None
    return IssueRef(
        id=issue_id,
        identifier=_str(d, "identifier"),
        title=_str(d, "title"),
        url=_str(d, "url"),
        description=_str(d, "description"),
    )


def _dict(d: dict[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _objects(d: dict[str, Any], key: str) -> list[dict[str, Any]] | None:
    v = d.get(key)
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else None


def intent(hook: Webhook, own_client_id: str | None = None) -> Intent:
    """`own_client_id`: this service's Linear OAuth client (LINEAR_CLIENT_ID), whose uninstall
    alone disconnects an org."""
    if not hook.org_id:
        return Intent("ignore", "no_organization")
    if hook.type == "Issue":
        return _issue_intent(hook)
    if hook.type == "AgentSessionEvent":
        return _agent_intent(hook)
    if hook.type == "OAuthApp" and hook.action == "revoked":
        # Every app's uninstall reaches a workspace webhook; only our own disconnects the org.
        if own_client_id is None or _str(hook.raw, "oauthClientId") != own_client_id:
            return Intent("ignore", "another_app_revoked")
        return Intent("disconnect", "linear_disconnected")
    return Intent("ignore", f"unhandled_type:{hook.type}")


def _source_comment(hook: Webhook) -> str | None:
    """The comment the agent session was started from, when Linear names it (`sourceCommentId`)
    and sent it: the thread's root (`agentSession.comment`) or one of `previousComments`. Never the
    root comment by default: for a delegation it is Linear's placeholder, for a mention in a reply
    someone else's words."""
    source = _str(hook.entity, "sourceCommentId")
    if source is None:
        return None
    for comment in [_dict(hook.entity, "comment"), *(_objects(hook.raw, "previousComments") or [])]:
        if comment.get("id") == source:
            return _str(comment, "body")
    return None


def _agent_intent(hook: Webhook) -> Intent:
    session = hook.entity
    agent_session_id = _str(session, "id")
    if agent_session_id is None:
        return Intent("ignore", "agent_session_without_id")
    issue = _issue(_dict(session, "issue"))
    # Started by a person: routed to them. By an automation (no creator): to the issue's assignee,
    # which Linear's webhook issue object does not carry: asked of Linear after the transaction.
    user = _str(session, "creatorId")
    if hook.action == "created":
        prompt = Prompt(
            body=_source_comment(hook),
            context=_str(hook.raw, "promptContext"),
            guidance=_objects(hook.raw, "guidance"),
            previous_comments=_objects(hook.raw, "previousComments"),
        )
        if issue is None:
            return Intent(
                "ignore",
                "agent_session_without_issue",
                agent_session_id=agent_session_id,
                unroutable_notice=True,
            )
        return Intent(
            "dispatch",
            issue=issue,
            user_id=user,
            agent_session_id=agent_session_id,
            prompt=prompt,
            unroutable_notice=True,
        )
    if hook.action == "prompted":
        activity = _dict(hook.raw, "agentActivity")
        signal = _str(activity, "signal")
        at = _time(activity, "createdAt")
        if signal == "stop":
            return Intent(
                "stop", issue=issue, user_id=user, agent_session_id=agent_session_id, activity_at=at
            )
        metadata = activity.get("signalMetadata")
        prompt = Prompt(
            body=_str(_dict(activity, "content"), "body"),
            signal=signal,
            signal_metadata=metadata if isinstance(metadata, dict) else None,
        )
        return Intent(
            "prompt",
            issue=issue,
            user_id=user,
            agent_session_id=agent_session_id,
            prompt=prompt,
            unroutable_notice=True,
            activity_at=at,
        )
    return Intent("ignore", f"agent_session_{hook.action}")


# What an event asks for, decided once from the event alone (`what_it_asks`); each has one way to be
# carried out (`shared.delivery.intake.CARRIED_OUT_BY`).
Asks = Literal[
    "nothing",  # recorded as ignored; Linear is not told
    "tell_unroutable",  # an agent session nothing can take (no issue): Linear is told why
    "disconnect",  # our app uninstalled from the workspace
    "start",  # an issue created with an assignee or assigned, an agent session started by a person
    "start_for_assignee",  # an agent session started by an automation: Linear must name the assignee
    "cancel",  # an issue unassigned or removed: its undelivered dispatch cancelled
    "cancel_and_start",  # an issue re-assigned: the cancel, then a start for the new assignee
    "follow_up",  # `prompted` in an agent session
    "answer",  # `prompted` with the `select` signal: maybe the answer to a repository question
    "stop",  # `prompted` with the stop signal
]
ASKS: tuple[Asks, ...] = get_args(Asks)  # (every kind, for the intake's table and its test)


@dataclass(frozen=True)
class Ask:
    """What one event asks for (`kind`) and its particulars (`plan`)."""

    kind: Asks
    plan: Intent


def what_it_asks(hook: Webhook, own_client_id: str | None = None) -> Ask:
    """The event's kind, by a pure function of the event (no database): what the database decides
    (a dispatch to cancel, a holder, a machine, a question waiting) is decided by the one way of
    that kind. `own_client_id`: as `intent`."""
    plan = intent(hook, own_client_id)
    return Ask(_kind(hook, plan), plan)


def _kind(hook: Webhook, plan: Intent) -> Asks:
    if plan.kind == "ignore":
        return "tell_unroutable" if plan.unroutable_notice and plan.agent_session_id else "nothing"
    if plan.kind == "disconnect" or plan.kind == "stop":
        return plan.kind
    if plan.kind == "cancel":
        return "cancel"
    if plan.kind == "prompt":
        return "answer" if plan.prompt is not None and plan.prompt.signal == "select" else "follow_up"
    if plan.agent_session_id is not None:  # (an agent session `created`)
        return "start" if plan.user_id is not None else "start_for_assignee"
    # An issue created with an assignee, or assigned with nobody before (`updatedFrom.assigneeId`
    # null): usually nothing to cancel, a start; re-assigned from someone: the cancel, then a start.
    before = _dict(hook.raw, "updatedFrom").get("assigneeId")
    return "start" if plan.cancel_issue_id is None or before is None else "cancel_and_start"


def _event_at(data: dict[str, Any]) -> datetime | None:
    """When Linear made the change (`updatedAt`)."""
    return _time(data, "updatedAt")


def _time(data: dict[str, Any], key: str) -> datetime | None:
    """A time Linear gives (ISO 8601 with its zone), in UTC; None when it is missing or not such a
    time (the event then orders against no other)."""
    value = data.get(key)
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        at = datetime.fromisoformat(value)
        # In UTC: Postgres refuses some zone offsets Python reads (+16:00, fractional seconds).
        return at.astimezone(UTC) if at.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None


def _issue_intent(hook: Webhook) -> Intent:
    data = hook.entity
    issue = _issue(data)
    if issue is None:
        return Intent("ignore", "issue_without_id")
    assignee = _str(data, "assigneeId")
    if hook.action == "remove":
        # Ordered as a change made just after its `updatedAt` (Linear's times are in milliseconds):
        # whatever its `updatedAt` says (the removal's time, or the last edit's), every assignment
        # made before it is at or before that time, and is then superseded by it; a removed issue
        # restored and assigned again is assigned later.
        removed = _event_at(data)
        at = removed + timedelta(microseconds=1) if removed is not None else None
        return Intent("cancel", issue=issue, cancel_issue_id=issue.id, event_at=at)
    if hook.action == "create":
        if assignee is None:
            return Intent("ignore", "unassigned")
        return Intent("dispatch", issue=issue, user_id=assignee, event_at=_event_at(data))
    if hook.action == "update":
        updated_from = hook.raw.get("updatedFrom")
        if not isinstance(updated_from, dict) or "assigneeId" not in updated_from:
            return Intent("ignore", "assignee_unchanged")
        if updated_from.get("assigneeId") == assignee:
            return Intent("ignore", "assignee_unchanged")
        at = _event_at(data)
        if assignee is None:
            return Intent("cancel", issue=issue, cancel_issue_id=issue.id, event_at=at)
        return Intent("dispatch", issue=issue, user_id=assignee, cancel_issue_id=issue.id, event_at=at)
    return Intent("ignore", f"issue_{hook.action}")
