"""Every GraphQL request the service can send, checked against Linear's published schema."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from shared.linear.notices import ACTIVITY_TYPE, request
from tests.helpers.api import agent_session_event, issue_event
from tests.helpers.linear import payload_errors, schema_errors


def row(**fields: Any) -> dict[str, Any]:
    base = {"id": uuid4(), "kind": "dispatched", "agent_session_id": None, "issue_id": None, "body": "hello"}
    return {**base, **fields}


@pytest.mark.parametrize("kind", sorted(ACTIVITY_TYPE))
def test_the_service_own_activities_are_valid(kind: str) -> None:
    post = request(row(kind=kind, agent_session_id="as-1"))
    assert post is not None and schema_errors(post) == []
    assert (
        post["variables"]["input"]["id"]
        and post["variables"]["input"]["content"]["type"] == ACTIVITY_TYPE[kind]
    )


@pytest.mark.parametrize(
    "content",
    [
        {"type": "thought", "body": "thinking"},
        {"type": "action", "action": "Running", "parameter": "pytest", "result": "ok"},
        {"type": "elicitation", "body": "which branch?"},
        {"type": "response", "body": "done"},
        {"type": "error", "body": "failed"},
    ],
)
def test_agent_activities_are_valid(content: dict[str, str]) -> None:
    post = request(row(kind="activity", agent_session_id="as-1", content=content, ephemeral=True))
    assert post is not None and schema_errors(post) == []
    assert post["variables"]["input"]["ephemeral"] is True


def test_failure_comment_is_valid_and_the_checker_catches_mistakes() -> None:
    post = request(row(kind="failed", issue_id="iss-1"))
    assert post is not None and "commentCreate" in post["query"] and schema_errors(post) == []
    assert schema_errors({**post, "variables": {"input": {"issueId": 1, "body": "x", "nope": True}}})
    assert schema_errors({"query": "mutation { commentCreate(input: {body: 1}) { ok } }"})
    assert request(row(kind="delivered")) is None  # plain assignments: nothing but failures is posted


@pytest.mark.parametrize(
    ("signal", "metadata"),
    [
        ("select", {"options": [{"label": "Postgres", "value": "Postgres"}, {"value": "SQLite"}]}),
        ("auth", {"url": "https://github.com/login/oauth/authorize?x=1", "providerName": "GitHub"}),
    ],
)
def test_an_elicitation_with_a_signal_is_valid(signal: str, metadata: dict[str, Any]) -> None:
    content = {"type": "elicitation", "body": "Which database?"}
    post = request(
        row(
            kind="activity", agent_session_id="as-1", content=content, signal=signal, signal_metadata=metadata
        )
    )
    assert post is not None and schema_errors(post) == []
    sent = post["variables"]["input"]
    assert (sent["signal"], sent["signalMetadata"]) == (signal, metadata)
    assert schema_errors({**post, "variables": {"input": {**sent, "signal": "pick"}}})  # not Linear's


def test_the_assignee_read_is_valid() -> None:
    from shared.delivery.routing import ASSIGNEE

    assert schema_errors({"query": ASSIGNEE, "variables": {"id": "issue-1"}}) == []
    assert schema_errors({"query": ASSIGNEE, "variables": {}})  # the id is required


@pytest.mark.parametrize(
    "event",
    [
        agent_session_event(),
        agent_session_event(body="@agent fix it"),
        agent_session_event(body="@agent you too", in_reply_to="Someone else's words"),
        agent_session_event(creator=None),
        agent_session_event(action="prompted", body="also the docs"),
        agent_session_event(action="prompted", signal="select", signal_metadata={"value": "Postgres"}),
        agent_session_event(action="prompted", signal="stop"),
    ],
)
def test_the_tests_agent_session_webhooks_are_shaped_as_linears(event: dict[str, Any]) -> None:
    """The tests' webhooks carry only what Linear's payload types have: no assignee on an agent
    session's issue, the request in promptContext."""
    assert payload_errors("AgentSessionEventWebhookPayload", event) == []
    broken = agent_session_event()
    broken["agentSession"]["issue"]["assigneeId"] = "user-1"
    assert payload_errors("AgentSessionEventWebhookPayload", broken) == [
        "AgentSessionEventWebhookPayload.agentSession.issue.assigneeId: no such field in "
        "IssueWithDescriptionChildWebhookPayload"
    ]


def test_the_tests_issue_webhooks_are_shaped_as_linears() -> None:
    event = issue_event("update", updated_from={"assigneeId": "user-0"})
    assert payload_errors("IssueWebhookPayload", event["data"]) == []
