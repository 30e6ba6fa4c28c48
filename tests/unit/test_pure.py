"""The pure parts, no database: the SQL file parser, request bodies, settings, webhook intent."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pydantic import ValidationError

from functions.bodies import RegisterBody
from functions.fleet_bodies import loose_uuid
from shared import sql
from shared.linear import BadWebhook, intent, parse
from shared.settings import Settings, SettingsError, load_settings


def test_sql_blocks_includes_and_errors() -> None:
    text = "-- name: a\n-- says what\nSELECT 1;\n\n-- name: frag\nx AS (SELECT 2)\n\n-- name: b\nWITH\n-- include: frag\nSELECT * FROM x;\n"
    q = sql.resolve(sql.parse(text))
    assert q["a"] == "SELECT 1;"  # (a comment line is for the file's reader, not sent)
    assert q["b"] == "WITH\nx AS (SELECT 2)\nSELECT * FROM x;"
    with pytest.raises(sql.QueryFileError, match="twice"):
        sql.parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")
    with pytest.raises(sql.QueryFileError, match="unknown"):
        sql.resolve(sql.parse("-- name: a\n-- include: nope\n"))
    with pytest.raises(sql.QueryFileError, match="itself"):
        sql.resolve(sql.parse("-- name: a\n-- include: a\n"))


def test_shipped_queries_load_and_the_dead_letter_chain_is_written_once() -> None:
    queries = sql.load()
    assert {"claim", "ack", "release", "sweep", "enqueue", "route", "notice_take"} <= set(queries)
    text = "".join(p.read_text() for p in sql.FOLDER.glob("*.sql"))
    assert text.count("SET status = 'failed'") == 1  # release and sweep both include end_claims
    assert "SET status = 'failed'" in queries["release"] and "SET status = 'failed'" in queries["sweep"]
    assert (
        text.count("secs => devpilot_backoff(") == 3 and "attempts * attempts" not in text
    )  # queue, notices, routing


def test_a_claims_limit_ceiling_is_written_in_as_digits_and_nothing_else() -> None:
    text = sql.query_with_limit("claim", 10)
    assert "LIMIT 16\n" in text and "%(max_ceiling)s" not in text and "LIMIT %(max)s" in text
    assert text.replace("LIMIT 16\n", "LIMIT %(max_ceiling)s\n") == sql.query("claim")
    ceilings = {n: sql.query_with_limit("poll", n).count("LIMIT 1024") for n in (513, 1000, 1024)}
    assert ceilings == {513: 1, 1000: 1, 1024: 1} and "LIMIT 1\n" in sql.query_with_limit("claim", 1)
    assert "LIMIT 2\n" in sql.query_with_limit("claim", 2) and "LIMIT 4\n" in sql.query_with_limit("claim", 3)
    for bad in (True, "10; DROP TABLE dispatch_queue", 2.5):  # (1 is cached: True must not find it)
        with pytest.raises(TypeError):
            sql.query_with_limit("claim", bad)
    with pytest.raises(ValueError):
        sql.query_with_limit("claim", 0)
    with pytest.raises(sql.QueryFileError, match="exactly one"):
        sql.query_with_limit("ack", 10)


def test_every_statement_is_short_enough_for_psycopgs_conversion_cache() -> None:
    """psycopg keeps a statement's converted placeholders only up to this length; a longer one is
    converted again on every execution (the webhook's statement was, at 5,859 bytes with its
    comments). The limit is psycopg's own constant, so a newer psycopg that changes it is followed."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    lengths = {name: len(text.encode()) for name, text in sql.load().items()}
    assert {n: n_bytes for n, n_bytes in lengths.items() if n_bytes > MAX_CACHED_STATEMENT_LENGTH} == {}
    assert not any(
        line.lstrip().startswith("--") for text in sql.load().values() for line in text.splitlines()
    )


def test_request_bodies() -> None:
    # (the fleet's plain bodies against pydantic's rules, case by case: tests/unit/test_fleet_bodies.py)
    with pytest.raises(ValidationError):
        RegisterBody.model_validate({"orgId": " ", "linearUserId": "u", "name": "n"})
    assert loose_uuid("not-a-uuid").int == 0


def test_settings_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings()
    assert (s.lease_seconds, s.backoff_base_seconds, s.backoff_cap_seconds, s.max_attempts) == (
        60,
        60,
        900,
        5,
    )
    assert s.webhook_tolerance_seconds == 60 and not s.realtime_enabled
    monkeypatch.setenv("DEVPILOT_LEASE_SECONDS", "soon")
    with pytest.raises(SettingsError, match="DEVPILOT_LEASE_SECONDS"):
        load_settings()
    monkeypatch.setenv("DEVPILOT_LEASE_SECONDS", "60")
    monkeypatch.setenv("DEVPILOT_BACKOFF_CAP_SECONDS", "10")
    with pytest.raises(SettingsError, match="CAP"):
        load_settings()
    monkeypatch.setenv("DEVPILOT_BACKOFF_CAP_SECONDS", "900")
    assert s.delivery_retention_hours == 168  # a week
    for hours, kept in (("0", 0), ("24", 24)):  # 0: for ever
        monkeypatch.setenv("DEVPILOT_DELIVERY_RETENTION_HOURS", hours)
        assert load_settings().delivery_retention_hours == kept
    monkeypatch.setenv("DEVPILOT_DELIVERY_RETENTION_HOURS", "6")  # shorter than Linear's retries
    with pytest.raises(SettingsError, match=r"DEVPILOT_DELIVERY_RETENTION_HOURS.*at least 24"):
        load_settings()


def test_settings_come_from_the_environment_in_any_case_and_yield_to_given_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("devpilot_pool_max", "7")
    monkeypatch.setenv("DEVPILOT_METRICS", "true")
    monkeypatch.setenv("DEVPILOT_ENDPOINTS", '{"claim": "https://claim.example"}')
    s = Settings()
    assert (s.database_pool_max, s.metrics_enabled) == (7, True)
    assert s.endpoints == {"claim": "https://claim.example"}
    assert Settings(DEVPILOT_POOL_MAX=3).database_pool_max == 3
    monkeypatch.setenv("DEVPILOT_ENDPOINTS", "{not json")
    with pytest.raises(SettingsError, match="DEVPILOT_ENDPOINTS"):
        load_settings()


def hook(body: dict[str, Any]) -> Any:
    return parse(
        json.dumps({"webhookTimestamp": int(time.time() * 1000), "organizationId": "o", **body}).encode()
    )


def test_webhook_intent() -> None:
    data = {"id": "i1", "assigneeId": "u1"}
    assert intent(hook({"type": "Issue", "action": "create", "data": data})).user_id == "u1"
    assert intent(hook({"type": "Issue", "action": "create", "data": {"id": "i1"}})).reason == "unassigned"
    moved = intent(
        hook({"type": "Issue", "action": "update", "data": data, "updatedFrom": {"assigneeId": "u0"}})
    )
    assert (moved.kind, moved.user_id, moved.cancel_issue_id) == ("dispatch", "u1", "i1")
    unassigned = {"type": "Issue", "action": "update", "data": {"id": "i1", "assigneeId": None}}
    assert intent(hook({**unassigned, "updatedFrom": {"assigneeId": "u0"}})).kind == "cancel"
    assert (
        intent(hook({"type": "Issue", "action": "update", "data": data, "updatedFrom": {"title": "x"}})).kind
        == "ignore"
    )
    assert intent(hook({"type": "Issue", "action": "remove", "data": data})).kind == "cancel"
    agent = {"id": "as1", "creatorId": "u2", "issue": {"id": "i2"}}
    started = intent(hook({"type": "AgentSessionEvent", "action": "created", "agentSession": agent}))
    assert (started.kind, started.user_id, started.agent_session_id) == ("dispatch", "u2", "as1")
    assert intent(hook({"type": "Comment", "action": "create", "data": {"id": "c"}})).kind == "ignore"
    for bad in (b"[]", b"{}", b'{"type":"Issue","action":"create","webhookTimestamp":"1","data":{}}'):
        with pytest.raises(BadWebhook):
            parse(bad)
