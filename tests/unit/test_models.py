"""The wire models (shared/delivery/models.py): what they write is what the pydantic models they replaced
wrote, byte for byte (rows written before are read back, and the machines parse the claim's
messages); what they write reads back as the same message; and importing them loads no pydantic."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, fields, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest

from shared.delivery.models import DispatchPayload, Enqueued
from shared.wire.messages import IssueRef, Prompt, Repository, TaskDispatchMessage, Wire
from tests.helpers.fresh_python import run_json

ISSUE = IssueRef(
    id="issue-1",
    identifier="ENG-7",
    title="Fix the \u00e9l\u00e8ve \U0001f600",
    url="https://linear.app/x/issue/ENG-7",
    description='line1\nline2 "quoted"',
)
START_PROMPT = Prompt(
    body="Please look",
    context="<issue>ENG-7</issue>",
    guidance=[{"body": "Use tabs", "origin": {"type": "workspace"}}],
    previous_comments=[
        {"id": "c1", "body": "first", "userId": "u1", "n": 3, "ok": True, "x": None, "f": 1.5}
    ],
)
FOLLOW_PROMPT = Prompt(
    body="acme/web",
    signal="select",
    signal_metadata={
        "options": [{"label": "acme/web", "value": "acme/web"}],
        "depth": {"a": [1, 2, {"b": None}]},
    },
)
REPO = Repository(hostname="github.com", full_name="acme/backend")
U = [UUID(f"{i:08x}-1234-4678-9234-56781234567{i}") for i in range(6)]


def _message(ids: tuple[int, int, int, int, int], **rest: Any) -> TaskDispatchMessage:
    """A message whose message, queue, session, orchestrator and claim-token ids are these of U."""
    m, q, s, o, c = (U[i] for i in ids)
    return TaskDispatchMessage(
        message_id=m, queue_id=q, session_id=s, orchestrator_id=o, claim_token=c, **rest
    )


CASES: dict[str, Wire] = {
    "message_utc": _message(
        (0, 1, 2, 3, 4),
        org_id="org-a",
        attempt=1,
        lease_expires_at=datetime(2026, 3, 4, 5, 6, 7, 890123, tzinfo=UTC),
        created_at=datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),
        issue=ISSUE,
        agent_session_id="as-1",
        kind="start",
        prompt=START_PROMPT,
        repository=REPO,
    ),
    "message_zones": _message(
        (5, 4, 3, 2, 1),
        org_id="org-b",
        attempt=7,
        lease_expires_at=datetime(2026, 1, 2, 3, 4, 5, 120000, tzinfo=ZoneInfo("Europe/Berlin")),
        created_at=datetime(2026, 7, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-3, minutes=-30))),
        issue=IssueRef(id="issue-2"),
        kind="prompt",
        prompt=FOLLOW_PROMPT,
    ),
    "message_etc_utc": _message(  # (UTC as psycopg gives it for a server in Etc/UTC)
        (0, 0, 0, 0, 0),
        org_id="o",
        attempt=0,
        lease_expires_at=datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=ZoneInfo("Etc/UTC")),
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        issue=IssueRef(id=""),
        kind="stop",
    ),
    "payload_minimal": DispatchPayload(issue=IssueRef(id="i")),
    "payload_full": DispatchPayload(
        issue=ISSUE, agent_session_id="as-1", kind="start", prompt=START_PROMPT, repository=REPO
    ),
    "payload_follow_up": DispatchPayload(
        issue=ISSUE, agent_session_id="as-1", kind="prompt", prompt=FOLLOW_PROMPT
    ),
    "payload_empty_prompt": DispatchPayload(issue=ISSUE, prompt=Prompt()),
    "enqueued": Enqueued(session_id=U[0], queue_id=U[1], message_id=U[2]),
    "enqueued_notice": Enqueued(session_id=U[0], queue_id=U[1], message_id=U[2], notice_id=U[3]),
    "repository": REPO,
    "repository_group": Repository(hostname="gitlab.example.com:8443", full_name="group/sub/name"),
    # (json.loads takes NaN and Infinity in a webhook's body; pydantic wrote them as null)
    "prompt_not_finite": Prompt(
        signal="auth", signal_metadata={"x": float("nan"), "y": [float("inf"), -float("inf"), 2.5]}
    ),
}

# Captured from the pydantic implementation (`model_dump(mode="json", by_alias=True)`, pydantic
# 2.14.4, before shared/delivery/models.py became dataclasses), as `json.dumps` wrote it: keys, their order,
# every value's type and spelling (UTC as `Z`, other offsets to the minute, microseconds when any).
EXPECTED = {
    "message_utc": r'{"messageId": "00000000-1234-4678-9234-567812345670", "queueId": "00000001-1234-4678-9234-567812345671", "sessionId": "00000002-1234-4678-9234-567812345672", "orgId": "org-a", "orchestratorId": "00000003-1234-4678-9234-567812345673", "attempt": 1, "claimToken": "00000004-1234-4678-9234-567812345674", "leaseExpiresAt": "2026-03-04T05:06:07.890123Z", "createdAt": "2026-03-04T05:06:07Z", "issue": {"id": "issue-1", "identifier": "ENG-7", "title": "Fix the \u00e9l\u00e8ve \ud83d\ude00", "url": "https://linear.app/x/issue/ENG-7", "description": "line1\nline2 \"quoted\""}, "agentSessionId": "as-1", "kind": "start", "prompt": {"body": "Please look", "context": "<issue>ENG-7</issue>", "signal": null, "signalMetadata": null, "guidance": [{"body": "Use tabs", "origin": {"type": "workspace"}}], "previousComments": [{"id": "c1", "body": "first", "userId": "u1", "n": 3, "ok": true, "x": null, "f": 1.5}]}, "repository": {"hostname": "github.com", "fullName": "acme/backend"}}',
    "message_zones": r'{"messageId": "00000005-1234-4678-9234-567812345675", "queueId": "00000004-1234-4678-9234-567812345674", "sessionId": "00000003-1234-4678-9234-567812345673", "orgId": "org-b", "orchestratorId": "00000002-1234-4678-9234-567812345672", "attempt": 7, "claimToken": "00000001-1234-4678-9234-567812345671", "leaseExpiresAt": "2026-01-02T03:04:05.120000+01:00", "createdAt": "2026-07-02T03:04:05-03:30", "issue": {"id": "issue-2", "identifier": null, "title": null, "url": null, "description": null}, "agentSessionId": null, "kind": "prompt", "prompt": {"body": "acme/web", "context": null, "signal": "select", "signalMetadata": {"options": [{"label": "acme/web", "value": "acme/web"}], "depth": {"a": [1, 2, {"b": null}]}}, "guidance": null, "previousComments": null}, "repository": null}',
    "message_etc_utc": r'{"messageId": "00000000-1234-4678-9234-567812345670", "queueId": "00000000-1234-4678-9234-567812345670", "sessionId": "00000000-1234-4678-9234-567812345670", "orgId": "o", "orchestratorId": "00000000-1234-4678-9234-567812345670", "attempt": 0, "claimToken": "00000000-1234-4678-9234-567812345670", "leaseExpiresAt": "2026-01-02T03:04:05.000001Z", "createdAt": "2026-01-02T03:04:05+05:30", "issue": {"id": "", "identifier": null, "title": null, "url": null, "description": null}, "agentSessionId": null, "kind": "stop", "prompt": null, "repository": null}',
    "payload_minimal": r'{"issue": {"id": "i", "identifier": null, "title": null, "url": null, "description": null}, "agentSessionId": null, "kind": "start", "prompt": null, "repository": null}',
    "payload_full": r'{"issue": {"id": "issue-1", "identifier": "ENG-7", "title": "Fix the \u00e9l\u00e8ve \ud83d\ude00", "url": "https://linear.app/x/issue/ENG-7", "description": "line1\nline2 \"quoted\""}, "agentSessionId": "as-1", "kind": "start", "prompt": {"body": "Please look", "context": "<issue>ENG-7</issue>", "signal": null, "signalMetadata": null, "guidance": [{"body": "Use tabs", "origin": {"type": "workspace"}}], "previousComments": [{"id": "c1", "body": "first", "userId": "u1", "n": 3, "ok": true, "x": null, "f": 1.5}]}, "repository": {"hostname": "github.com", "fullName": "acme/backend"}}',
    "payload_follow_up": r'{"issue": {"id": "issue-1", "identifier": "ENG-7", "title": "Fix the \u00e9l\u00e8ve \ud83d\ude00", "url": "https://linear.app/x/issue/ENG-7", "description": "line1\nline2 \"quoted\""}, "agentSessionId": "as-1", "kind": "prompt", "prompt": {"body": "acme/web", "context": null, "signal": "select", "signalMetadata": {"options": [{"label": "acme/web", "value": "acme/web"}], "depth": {"a": [1, 2, {"b": null}]}}, "guidance": null, "previousComments": null}, "repository": null}',
    "payload_empty_prompt": r'{"issue": {"id": "issue-1", "identifier": "ENG-7", "title": "Fix the \u00e9l\u00e8ve \ud83d\ude00", "url": "https://linear.app/x/issue/ENG-7", "description": "line1\nline2 \"quoted\""}, "agentSessionId": null, "kind": "start", "prompt": {"body": null, "context": null, "signal": null, "signalMetadata": null, "guidance": null, "previousComments": null}, "repository": null}',
    "enqueued": r'{"sessionId": "00000000-1234-4678-9234-567812345670", "queueId": "00000001-1234-4678-9234-567812345671", "messageId": "00000002-1234-4678-9234-567812345672", "noticeId": null}',
    "enqueued_notice": r'{"sessionId": "00000000-1234-4678-9234-567812345670", "queueId": "00000001-1234-4678-9234-567812345671", "messageId": "00000002-1234-4678-9234-567812345672", "noticeId": "00000003-1234-4678-9234-567812345673"}',
    "repository": r'{"hostname": "github.com", "fullName": "acme/backend"}',
    "repository_group": r'{"hostname": "gitlab.example.com:8443", "fullName": "group/sub/name"}',
    "prompt_not_finite": r'{"body": null, "context": null, "signal": "auth", "signalMetadata": {"x": null, "y": [null, null, 2.5]}, "guidance": null, "previousComments": null}',
}


@pytest.mark.parametrize("name", CASES)
def test_wire_is_byte_for_byte_what_pydantic_wrote(name: str) -> None:
    assert json.dumps(CASES[name].wire()) == EXPECTED[name]
    # (as the claim's reply writes it, too)
    assert json.dumps(CASES[name].wire(), separators=(",", ":")) == json.dumps(
        json.loads(EXPECTED[name]), separators=(",", ":")
    )


@pytest.mark.parametrize("name", [n for n in CASES if n != "prompt_not_finite"])
def test_what_a_model_writes_reads_back_as_the_same_model(name: str) -> None:
    m = CASES[name]
    assert type(m).from_wire(m.wire()) == m
    assert type(m).from_wire(json.loads(json.dumps(m.wire()))) == m  # (as a jsonb row comes back)


def snake(m: Wire) -> dict[str, Any]:
    """The model's fields under their own (snake_case) names, nested models likewise, values as the
    wire has them (strings for UUIDs and times)."""
    wired = m.wire()
    out: dict[str, Any] = {}
    for f, key in zip(fields(m), wired, strict=True):
        value = getattr(m, f.name)
        out[f.name] = snake(value) if isinstance(value, Wire) else wired[key]
    return out


@pytest.mark.parametrize("name", [n for n in CASES if n != "prompt_not_finite"])
def test_from_wire_takes_snake_case_keys_too(name: str) -> None:
    m = CASES[name]
    assert type(m).from_wire(snake(m)) == m


def test_from_wire_reads_each_key_and_builds_nested_models() -> None:
    camel = {
        "issue": {"id": "i", "identifier": "X-1"},
        "agentSessionId": "as-1",
        "kind": "prompt",
        "prompt": {"body": "b", "signalMetadata": {"k": 1}, "previousComments": [{"id": "c"}]},
        "repository": {"hostname": "github.com", "fullName": "acme/web"},
    }
    want = DispatchPayload(
        issue=IssueRef(id="i", identifier="X-1"),
        agent_session_id="as-1",
        kind="prompt",
        prompt=Prompt(body="b", signal_metadata={"k": 1}, previous_comments=[{"id": "c"}]),
        repository=Repository(hostname="github.com", full_name="acme/web"),
    )
    assert DispatchPayload.from_wire(camel) == want
    mixed = {
        "issue": {"id": "i", "identifier": "X-1"},
        "agent_session_id": "as-1",
        "kind": "prompt",
        "prompt": {"body": "b", "signal_metadata": {"k": 1}, "previousComments": [{"id": "c"}]},
        "repository": {"hostname": "github.com", "full_name": "acme/web"},
    }
    assert DispatchPayload.from_wire(mixed) == want
    # Missing optional keys take their defaults; unknown keys are ignored (a stored candidate
    # repository has its `confidence` beside it).
    assert DispatchPayload.from_wire({"issue": {"id": "i"}}) == DispatchPayload(issue=IssueRef(id="i"))
    assert Repository.from_wire({"hostname": "h", "fullName": "a/b", "confidence": 0.4}) == Repository(
        "h", "a/b"
    )
    with pytest.raises(TypeError):
        Repository.from_wire({"hostname": "h"})


def test_from_wire_reads_uuids_and_times() -> None:
    m = TaskDispatchMessage.from_wire(json.loads(EXPECTED["message_zones"]))
    assert m.message_id == U[5] and isinstance(m.message_id, UUID)
    assert m.lease_expires_at == datetime(2026, 1, 2, 2, 4, 5, 120000, tzinfo=UTC)
    assert m.lease_expires_at.utcoffset() == timedelta(hours=1)
    assert m.created_at.utcoffset() == timedelta(hours=-3, minutes=-30)
    assert m.issue == IssueRef(id="issue-2") and m.repository is None and m.prompt == FOLLOW_PROMPT
    assert m == CASES["message_zones"]


def test_models_are_frozen() -> None:
    m = DispatchPayload(issue=IssueRef(id="i"))
    with pytest.raises(FrozenInstanceError):
        m.kind = "stop"  # type: ignore[misc]
    assert replace(m, kind="stop").kind == "stop" and m.kind == "start"
    assert hash(m) == hash(DispatchPayload(issue=IssueRef(id="i")))


def test_importing_the_models_loads_no_pydantic() -> None:
    # (a fresh interpreter: this one has loaded pydantic for other modules)
    code = (
        "import sys, json, shared.delivery.models; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core'))))"
    )
    assert run_json(code) == []
