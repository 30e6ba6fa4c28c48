"""The pure parts, no database: the SQL file parser, request bodies, settings, webhook intent."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from pydantic import ValidationError

from functions.bodies import RegisterBody
from functions.fleet_bodies import loose_uuid
from shared.linear.webhooks import BadWebhook, intent, parse
from shared.plumbing import sql
from shared.plumbing.settings import Settings, SettingsError, get_settings, load_settings
from tests.helpers.fresh_python import run_json


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


# The statements allowed over the cache's limit: each is sent once per batch of webhooks (a group
# commit's), not once per webhook, and converting it again costs about 30 microseconds a batch
# (bench/README.md, "What was tried"), where deciding it in two statements would cost a round trip.
CONVERTED_PER_BATCH = {"follow_ups_for_delivery", "issue_changes_for_delivery"}


def test_every_statement_is_short_enough_for_psycopgs_conversion_cache() -> None:
    """psycopg keeps a statement's converted placeholders only up to this length; a longer one is
    converted again on every execution (the webhook's statement was, at 5,859 bytes with its
    comments). The limit is psycopg's own constant, so a newer psycopg that changes it is followed."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    lengths = {name: len(text.encode()) for name, text in sql.load().items()}
    longer = {n: n_bytes for n, n_bytes in lengths.items() if n_bytes > MAX_CACHED_STATEMENT_LENGTH}
    assert longer.keys() == CONVERTED_PER_BATCH, longer
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
    assert Settings.defaults()["DEVPILOT_POOL_MAX"] == 10 and Settings.defaults()["DATABASE_URL"] is None
    monkeypatch.setenv("DEVPILOT_LEASE_SECONDS", "soon")
    with pytest.raises(SettingsError, match="DEVPILOT_LEASE_SECONDS"):
        load_settings()
    monkeypatch.setenv("DEVPILOT_LEASE_SECONDS", "60")
    monkeypatch.setenv("DEVPILOT_BACKOFF_CAP_SECONDS", "10")
    with pytest.raises(SettingsError, match="CAP"):
        load_settings()
    monkeypatch.setenv("DEVPILOT_BACKOFF_CAP_SECONDS", "60")  # equal to the base: allowed
    assert load_settings().backoff_cap_seconds == 60
    monkeypatch.setenv("DEVPILOT_BACKOFF_CAP_SECONDS", "900")
    monkeypatch.setenv("DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS", "5000")  # the Linear timeout's 5 s
    with pytest.raises(SettingsError, match="DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS: must exceed"):
        load_settings()
    monkeypatch.setenv("DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS", "5001")
    assert load_settings().idle_in_transaction_timeout_ms == 5001
    monkeypatch.delenv("DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS")
    assert s.delivery_retention_hours == 168  # a week
    for hours, kept in (("0", 0), ("24", 24)):  # 0: for ever
        monkeypatch.setenv("DEVPILOT_DELIVERY_RETENTION_HOURS", hours)
        assert load_settings().delivery_retention_hours == kept
    monkeypatch.setenv("DEVPILOT_DELIVERY_RETENTION_HOURS", "6")  # shorter than Linear's retries
    with pytest.raises(SettingsError, match=r"DEVPILOT_DELIVERY_RETENTION_HOURS.*at least 24"):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value", "why"),
    [
        ("DEVPILOT_LEASE_SECONDS", "soon", "not an integer"),
        ("DEVPILOT_LEASE_SECONDS", "10.5", "not an integer"),  # a float where an int belongs
        ("DEVPILOT_LEASE_SECONDS", "true", "not an integer"),
        ("DEVPILOT_LINEAR_TIMEOUT_SECONDS", "fast", "not a number"),
        ("DEVPILOT_METRICS", "maybe", "not a boolean"),
        ("DEVPILOT_METRICS", "", "not a boolean"),
        ("DEVPILOT_POOL_MAX", "0", "must be >= 1"),  # ge
        ("DEVPILOT_REPOSITORY_CONFIDENCE", "-0.1", "must be >= 0"),  # ge, of a float
        ("DEVPILOT_DB_CONNECT_TIMEOUT_SECONDS", "0", "must be > 0"),  # gt, at its boundary
        ("DEVPILOT_DB_CONNECT_TIMEOUT_SECONDS", "nan", "must be > 0"),
        ("DEVPILOT_POOL_MAX", "201", "must be <= 200"),  # le
        ("DEVPILOT_REPOSITORY_CONFIDENCE", "1.01", "must be <= 1"),
        ("DEVPILOT_ENDPOINTS", "{not json", "not JSON"),
        ("DEVPILOT_ENDPOINTS", '["https://claim.example"]', "not a JSON object"),
        ("DEVPILOT_ENDPOINTS", '{"claim": 1}', "not a JSON object"),
    ],
)
def test_a_bad_value_is_reported_with_its_variable_and_why(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, why: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=rf"^invalid configuration: {variable}: {re.escape(why)}"):
        load_settings()
    with pytest.raises(SettingsError, match=rf"^invalid configuration: {variable}: {re.escape(why)}"):
        Settings(**{variable: value})  # (given, as the environment spells it)


def test_every_bad_value_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVPILOT_POOL_MAX", "0")
    monkeypatch.setenv("DEVPILOT_METRICS", "maybe")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        "invalid configuration: DEVPILOT_POOL_MAX: must be >= 1; DEVPILOT_METRICS: not a boolean "
        "(true/false, 1/0, yes/no, on/off, t/f, y/n)"
    )


def test_settings_convert_what_the_environment_spells_as_pydantic_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for text, number in (("10", 10), (" 10 ", 10), ("1_0", 10), ("10.0", 10), ("+7", 7)):
        monkeypatch.setenv("DEVPILOT_POOL_MAX", text)
        got = load_settings().database_pool_max
        assert (got, type(got)) == (number, int), text
    for text, seconds in (("2.5", 2.5), ("3", 3.0), (".5", 0.5), ("1e1", 10.0)):
        monkeypatch.setenv("DEVPILOT_REQUEST_DEADLINE_SECONDS", text)
        got_seconds = load_settings().request_deadline_seconds
        assert (got_seconds, type(got_seconds)) == (seconds, float), text
    words = {"true": True, "1": True, "yes": True, "on": True, "t": True, "y": True}
    words |= {"false": False, "0": False, "no": False, "off": False, "f": False, "n": False}
    for word, meaning in words.items():
        for spelled in (word, word.upper()):
            monkeypatch.setenv("DEVPILOT_METRICS", spelled)
            assert load_settings().metrics_enabled is meaning, spelled
    monkeypatch.setenv("DEVPILOT_PUBLIC_URL", "")  # set, but empty: kept as it is
    assert load_settings().public_url == ""


def test_settings_come_from_the_environment_in_any_case_and_yield_to_given_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("devpilot_pool_max", "7")
    monkeypatch.setenv("DEVPILOT_METRICS", "true")
    monkeypatch.setenv("DEVPILOT_ENDPOINTS", '{"claim": "https://claim.example"}')
    monkeypatch.setenv("DATABASE_URL", "postgresql://db.example/dispatch")
    s = Settings()
    assert (s.database_pool_max, s.metrics_enabled) == (7, True)
    assert s.endpoints == {"claim": "https://claim.example"}
    assert s.database_url == "postgresql://db.example/dispatch"
    given = Settings(DEVPILOT_POOL_MAX=3, DEVPILOT_METRICS=False, DATABASE_URL=None)
    assert (given.database_pool_max, given.metrics_enabled, given.database_url) == (3, False, None)
    assert Settings(DEVPILOT_POOL_MAX="4", DEVPILOT_ENDPOINTS={"ack": "https://a"}).database_pool_max == 4
    assert Settings(DEVPILOT_ENDPOINTS={"ack": "https://a"}).endpoints == {"ack": "https://a"}
    # Unknown names are ignored; a field's attribute name is a mistake, refused, so that
    # dataclasses.replace cannot quietly read every value afresh (Settings.replace is the way).
    assert Settings(NOT_A_SETTING=1).database_pool_max == 7
    with pytest.raises(TypeError, match="database_pool_max"):
        Settings(database_pool_max=99)
    with pytest.raises(TypeError):
        dataclasses.replace(given, lease_seconds=30)
    assert given.replace(lease_seconds=30).database_pool_max == 3  # (the given values kept)
    with pytest.raises(TypeError):
        hash(Settings(DEVPILOT_ENDPOINTS=None))  # (not hashable, as the pydantic model was not,
        # whether or not `endpoints`, a dict, is set)
    monkeypatch.setenv("DEVPILOT_ENDPOINTS", "{not json")
    with pytest.raises(SettingsError, match="DEVPILOT_ENDPOINTS"):
        load_settings()
    assert Settings(DEVPILOT_ENDPOINTS=None).endpoints is None  # (given: the environment is not read)


def test_settings_do_not_change_and_a_copy_checks_its_changes() -> None:
    s = Settings(DEVPILOT_MAX_ATTEMPTS=3)
    with pytest.raises(FrozenInstanceError):
        s.max_attempts = 4  # type: ignore[misc]
    copy = s.replace(admin_token="admin", lease_seconds=30)
    assert (copy.admin_token, copy.lease_seconds, copy.max_attempts) == ("admin", 30, 3)
    assert (s.admin_token, s.lease_seconds) == (None, 60)
    with pytest.raises(SettingsError, match="DEVPILOT_LEASE_SECONDS: must be >= 1"):
        s.replace(lease_seconds=0)
    with pytest.raises(TypeError, match="lease"):
        s.replace(lease=30)


def test_settings_are_read_without_importing_pydantic() -> None:
    """Every target reads them on its first request; pydantic's import is 50–90 ms of a cold start."""
    code = (
        "import sys, json, shared.plumbing.settings; shared.plumbing.settings.get_settings(); "
        "print(json.dumps(sorted(m for m in sys.modules if m.partition('.')[0] in ('pydantic', 'pydantic_core'))))"
    )
    assert run_json(code) == []
    assert get_settings() is get_settings()  # (read once)


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
