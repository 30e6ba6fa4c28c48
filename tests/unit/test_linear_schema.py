"""Every GraphQL request the service can send, checked against Linear's published schema."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from shared.notices import ACTIVITY_TYPE, request
from tests.helpers.linear import schema_errors


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
