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
from typing import Any, Literal

from shared import jsoninput
from shared.models import IssueRef, Prompt


class BadWebhook(ValueError):
    """The body is not a webhook we can read; answered 400 bad_request."""


def signature_ok(secret: str, body: bytes, signature: str | None) -> bool:
    """Any header value at all (non-ASCII, huge, empty) is compared as bytes: a mismatch, never an
    exception (compare_digest refuses non-ASCII str)."""
    if not signature:
        return False
    expected = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, signature.strip().encode("utf-8", "surrogateescape"))


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
    cancel the issue's open assignment dispatch, or nothing."""

    kind: Literal["dispatch", "cancel", "prompt", "stop", "disconnect", "ignore"]
    reason: str = ""
    issue: IssueRef | None = None
    user_id: str | None = None  # the Linear user whose orchestrator takes it
    cancel_issue_id: str | None = None  # cancel this issue's open dispatch first
    agent_session_id: str | None = None
    prompt: Prompt | None = None
    unroutable_notice: bool = False  # tell Linear when nothing can take it (agent sessions only)


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


def intent(hook: Webhook) -> Intent:
    if not hook.org_id:
        return Intent("ignore", "no_organization")
    if hook.type == "Issue":
        return _issue_intent(hook)
    if hook.type == "AgentSessionEvent":
        return _agent_intent(hook)
    if hook.type == "OAuthApp" and hook.action == "revoked":
        return Intent("disconnect", "linear_disconnected")
    return Intent("ignore", f"unhandled_type:{hook.type}")


def _agent_intent(hook: Webhook) -> Intent:
    session = hook.entity
    agent_session_id = _str(session, "id")
    if agent_session_id is None:
        return Intent("ignore", "agent_session_without_id")
    raw_issue = _dict(session, "issue")
    issue = _issue(raw_issue)
    # Started by a person: route by them; by an automation (no creator): by the issue's assignee.
    user = _str(session, "creatorId") or _str(raw_issue, "assigneeId")
    if hook.action == "created":
        prompt = Prompt(body=_str(_dict(session, "comment"), "body"), context=_str(hook.raw, "promptContext"))
        if issue is None or user is None:
            return Intent(
                "ignore",
                "agent_session_without_issue_or_user",
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
        if activity.get("signal") == "stop":
            return Intent("stop", issue=issue, user_id=user, agent_session_id=agent_session_id)
        body = _str(_dict(activity, "content"), "body")
        return Intent(
            "prompt",
            issue=issue,
            user_id=user,
            agent_session_id=agent_session_id,
            prompt=Prompt(body=body),
            unroutable_notice=True,
        )
    return Intent("ignore", f"agent_session_{hook.action}")


def _issue_intent(hook: Webhook) -> Intent:
    data = hook.entity
    issue = _issue(data)
    if issue is None:
        return Intent("ignore", "issue_without_id")
    assignee = _str(data, "assigneeId")
    if hook.action == "remove":
        return Intent("cancel", issue=issue, cancel_issue_id=issue.id)
    if hook.action == "create":
        if assignee is None:
            return Intent("ignore", "unassigned")
        return Intent("dispatch", issue=issue, user_id=assignee)
    if hook.action == "update":
        updated_from = hook.raw.get("updatedFrom")
        if not isinstance(updated_from, dict) or "assigneeId" not in updated_from:
            return Intent("ignore", "assignee_unchanged")
        if updated_from.get("assigneeId") == assignee:
            return Intent("ignore", "assignee_unchanged")
        if assignee is None:
            return Intent("cancel", issue=issue, cancel_issue_id=issue.id)
        return Intent("dispatch", issue=issue, user_id=assignee, cancel_issue_id=issue.id)
    return Intent("ignore", f"issue_{hook.action}")
