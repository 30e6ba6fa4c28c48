"""Webhook delivery records are kept for DEVPILOT_DELIVERY_RETENTION_HOURS, then the sweep forgets
them (and the stops of agent sessions with them): a retry within the retention is still a
duplicate, and the tables do not grow for ever. Nor does the sweep's own record of its runs."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.delivery.intake import PRUNE_BATCHES, prune_deliveries
from shared.delivery.queue import SWEEP_BATCH, SWEEP_RUNS_KEPT, sweep
from shared.plumbing.db import Pool
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from tests.helpers.api import Api, issue_event


def _age(pool: Pool, deliveries: list[str], days: float) -> None:
    keys = [f"delivery:{d}" for d in deliveries]  # (as the intake stores a Linear-Delivery id)
    with pool.connection() as conn:
        conn.execute(
            "UPDATE webhook_deliveries SET received_at = now() - make_interval(secs => %s)"
            " WHERE delivery_key = ANY(%s)",
            (days * 86_400, keys),
        )


def _keys(pool: Pool) -> set[str]:
    with pool.connection() as conn:
        return {r["delivery_key"] for r in conn.execute("SELECT delivery_key FROM webhook_deliveries")}


def _old_records(pool: Pool, n: int, days: float = 30) -> None:
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO webhook_deliveries (delivery_key, content_key, outcome, received_at)"
            " SELECT 'old-' || i, 'old-content-' || i, 'ignored', now() - make_interval(secs => %s)"
            " FROM generate_series(1, %s) i",
            (days * 86_400, n),
        )


def test_the_sweep_forgets_deliveries_past_the_retention_and_nothing_else(api: Api) -> None:
    api.register()
    sessions: dict[str, Any] = {}
    for key, issue in (("d-old", "iss-1"), ("d-week-less-a-day", "iss-2"), ("d-new", "iss-3")):
        r = api.webhook(issue_event(issue_id=issue), delivery=key)
        assert r.json()["status"] == "dispatched", r.text
        sessions[key] = r.json()["sessionId"]
    edit = issue_event(issue_id="iss-4", action="update")  # ignored: only its delivery recorded
    assert api.webhook(edit, delivery="d-old-ignored").json()["status"] == "ignored"
    _age(api.pool, ["d-old", "d-old-ignored"], days=7.1)  # the default retention is 168 h
    _age(api.pool, ["d-week-less-a-day"], days=6)

    r = api.http.post("/sweep", headers=api.admin())
    assert r.status_code == 200 and r.json() == {"requeued": 0, "deadLettered": 0}

    assert _keys(api.pool) == {"delivery:d-week-less-a-day", "delivery:d-new"}
    with api.pool.connection() as conn:  # the sessions and their messages are not the records
        n = conn.execute("SELECT count(*) AS n FROM dispatch_queue").fetchone()
    assert n is not None and n["n"] == 3
    for key, issue in (("d-week-less-a-day", "iss-2"), ("d-new", "iss-3")):  # still retries
        again = api.webhook(issue_event(issue_id=issue), delivery=key).json()
        assert again == {"status": "duplicate", "sessionId": sessions[key]}


def test_a_backlog_is_pruned_in_batches_a_bounded_number_a_sweep(pool: Pool, settings: Settings) -> None:
    cap = SWEEP_BATCH * PRUNE_BATCHES
    _old_records(pool, cap + 1500)
    recent = [f"kept-{i}" for i in range(3)]
    with pool.connection() as conn:
        for key in recent:
            conn.execute(
                "INSERT INTO webhook_deliveries (delivery_key, content_key, outcome) VALUES (%s, %s, 'ignored')",
                (key, key),
            )
    assert prune_deliveries(pool, settings) == cap  # one sweep's share: the rest waits for the next
    assert prune_deliveries(pool, settings) == 1500
    assert prune_deliveries(pool, settings) == 0
    assert _keys(pool) == set(recent)


def test_concurrent_sweeps_forget_each_record_once(pool: Pool, settings: Settings) -> None:
    _old_records(pool, 5000)
    counts: list[int] = []
    start = threading.Barrier(4)

    def sweep() -> None:
        start.wait()
        counts.append(prune_deliveries(pool, settings))

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == 5000 and _keys(pool) == set()


def test_a_retention_of_zero_keeps_every_record(pool: Pool) -> None:
    _old_records(pool, 10, days=3650)
    assert prune_deliveries(pool, Settings(DATABASE_URL=None, DEVPILOT_DELIVERY_RETENTION_HOURS=0)) == 0
    assert len(_keys(pool)) == 10


@pytest.mark.parametrize("hours", [24, 48])
def test_the_retention_is_the_setting(pool: Pool, hours: int) -> None:
    _old_records(pool, 5, days=(hours - 1) / 24)  # an hour short of it
    retention = Settings(DATABASE_URL=None, DEVPILOT_DELIVERY_RETENTION_HOURS=hours)
    assert prune_deliveries(pool, retention) == 0
    with pool.connection() as conn:
        conn.execute("UPDATE webhook_deliveries SET received_at = received_at - interval '2 hours'")
    assert prune_deliveries(pool, retention) == 5


def test_agent_sessions_stops_are_kept_as_long_as_the_deliveries(pool: Pool) -> None:
    """A stop is remembered so that a `created` handled after it starts nothing; once Linear can no
    longer retry that `created` (the deliveries' retention), the record is forgotten with them, in
    the same bounded batches (a backlog over several statements of one sweep)."""
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO agent_session_stops (org_id, agent_session_id, stopped_at)"
            " SELECT 'org-a', 'as-' || i, now() - interval '25 hours' FROM generate_series(1, %s) i",
            (SWEEP_BATCH + 10,),
        )
        conn.execute(
            "INSERT INTO agent_session_stops (org_id, agent_session_id) VALUES ('org-a', 'as-recent')"
        )
    assert prune_deliveries(pool, Settings(DATABASE_URL=None, DEVPILOT_DELIVERY_RETENTION_HOURS=24)) == 0
    with pool.connection() as conn:
        left = [
            r["agent_session_id"] for r in conn.execute("SELECT agent_session_id FROM agent_session_stops")
        ]
    assert left == ["as-recent"]


def test_the_sweep_keeps_only_the_last_runs_record(pool: Pool, settings: Settings) -> None:
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO sweep_runs (ran_at, requeued, dead_lettered)"
            " SELECT now() - make_interval(secs => 30 * i), 0, 0 FROM generate_series(%s, 1, -1) i",
            (SWEEP_RUNS_KEPT + 100,),
        )
    sweep(pool, settings)
    with pool.connection() as conn:
        kept = conn.execute("SELECT count(*) AS n, max(id) AS last FROM sweep_runs").fetchone()
        latest = conn.execute(query("status_last_sweep")).fetchone()
    assert kept is not None and kept["n"] == SWEEP_RUNS_KEPT
    assert latest is not None and latest["ran_at"] > datetime.now(UTC) - timedelta(minutes=1)
