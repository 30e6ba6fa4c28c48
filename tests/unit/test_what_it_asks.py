"""What a webhook asks for, decided once from the event alone (`shared.linear.webhooks.what_it_asks`), and
the one way each kind is carried out (`shared.delivery.intake.CARRIED_OUT_BY`). No database."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from shared.delivery import intake
from shared.linear.webhooks import ASKS, Asks, parse, what_it_asks

OWN = "our-client"
ISSUE = {"id": "i1", "identifier": "ENG-1", "assigneeId": "u1", "updatedAt": "2026-01-02T03:04:05.000Z"}
UNASSIGNED = {**ISSUE, "assigneeId": None}
AGENT = {"id": "as1", "creatorId": "u2", "issue": {"id": "i2"}}


def event(body: dict[str, Any], org: str | None = "o") -> dict[str, Any]:
    return {"webhookTimestamp": int(time.time() * 1000), "organizationId": org, **body}


def prompted(signal: str | None = None, agent: dict[str, Any] = AGENT) -> dict[str, Any]:
    activity: dict[str, Any] = {"id": "a1", "content": {"body": "more"}, "createdAt": "2026-01-02T03:04:05Z"}
    if signal is not None:
        activity["signal"] = signal
    return {
        "type": "AgentSessionEvent",
        "action": "prompted",
        "agentSession": agent,
        "agentActivity": activity,
    }


# Every kind of event a workspace sends, and what it asks for.
EVENTS: list[tuple[str, dict[str, Any], Asks]] = [
    (
        "edit",
        event({"type": "Issue", "action": "update", "data": ISSUE, "updatedFrom": {"title": "x"}}),
        "nothing",
    ),
    ("created unassigned", event({"type": "Issue", "action": "create", "data": UNASSIGNED}), "nothing"),
    ("another type", event({"type": "Comment", "action": "create", "data": {"id": "c"}}), "nothing"),
    ("no organization", event({"type": "Issue", "action": "create", "data": ISSUE}, org=None), "nothing"),
    (
        "another app uninstalled",
        event({"type": "OAuthApp", "action": "revoked", "oauthClientId": "theirs"}),
        "nothing",
    ),
    (
        "our app uninstalled",
        event({"type": "OAuthApp", "action": "revoked", "oauthClientId": OWN}),
        "disconnect",
    ),
    (
        "agent session without an issue",
        event({"type": "AgentSessionEvent", "action": "created", "agentSession": {"id": "as9"}}),
        "tell_unroutable",
    ),
    ("issue created assigned", event({"type": "Issue", "action": "create", "data": ISSUE}), "start"),
    (
        "existing issue assigned",
        event({"type": "Issue", "action": "update", "data": ISSUE, "updatedFrom": {"assigneeId": None}}),
        "start",
    ),
    (
        "agent session created",
        event({"type": "AgentSessionEvent", "action": "created", "agentSession": AGENT}),
        "start",
    ),
    (
        "agent session created by an automation",
        event(
            {"type": "AgentSessionEvent", "action": "created", "agentSession": {**AGENT, "creatorId": None}}
        ),
        "start_for_assignee",
    ),
    (
        "re-assigned",
        event({"type": "Issue", "action": "update", "data": ISSUE, "updatedFrom": {"assigneeId": "u0"}}),
        "cancel_and_start",
    ),
    (
        "unassigned",
        event({"type": "Issue", "action": "update", "data": UNASSIGNED, "updatedFrom": {"assigneeId": "u0"}}),
        "cancel",
    ),
    ("removed", event({"type": "Issue", "action": "remove", "data": ISSUE}), "cancel"),
    ("prompted", event(prompted()), "follow_up"),
    ("prompted with a pick", event(prompted("select")), "answer"),
    ("stopped", event(prompted("stop")), "stop"),
]


@pytest.mark.parametrize(("name", "body", "kind"), EVENTS, ids=[e[0] for e in EVENTS])
def test_each_event_asks_for_one_kind(name: str, body: dict[str, Any], kind: Asks) -> None:
    ask = what_it_asks(parse(json.dumps(body).encode()), OWN)
    assert ask.kind == kind


def test_the_events_cover_every_kind() -> None:
    assert {kind for _, _, kind in EVENTS} == set(ASKS)


def test_each_kind_is_carried_out_one_way() -> None:
    """Every kind has exactly one way (the table is total over the kinds, and names nothing else)."""
    assert sorted(intake.CARRIED_OUT_BY) == sorted(ASKS)
    assert all(callable(way) for way in intake.CARRIED_OUT_BY.values())


def test_the_event_is_classified_without_a_database() -> None:
    """The same event asks the same thing, every time, with nothing but the event (and our client)."""
    body = json.dumps(EVENTS[-1][1]).encode()
    asks = {what_it_asks(parse(body), OWN) for _ in range(3)}
    assert len(asks) == 1
    assert what_it_asks(parse(json.dumps(EVENTS[5][1]).encode()), None).kind == "nothing"
