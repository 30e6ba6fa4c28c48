"""Upgrading a live database: the release before serves webhooks (a real `devpilot serve` of its own
code, from the repository's history) while `devpilot migrate` applies every migration since, on a
database with sessions and posts; no webhook waits more than 1 s (Linear gives up at 5). Always
on: 20,000 sessions, and a transaction left open on the tables the migrations change (the worst
moment to migrate: a lock that is waited for holds every write of its table behind it); heavy
lane (DEVPILOT_HEAVY=1): 1,000,000 sessions."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from bench.year import seed
from shared.plumbing.db import open_pool
from shared.plumbing.migrate import SCHEMA, discover, migrate
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.data import api_settings
from tests.helpers.pg import Server
from tests.helpers.releases import FIRST_UNRELEASED, before_each_migration, checkout
from tests.helpers.serving import free_port, start_serve, wait_healthy

RELEASES = before_each_migration()
pytestmark = pytest.mark.skipif(not RELEASES, reason="the repository's history is not here (shallow clone)")
ONE_SECOND = 1.0


def _old_migrate(old: Path, url: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from shared.plumbing.migrate import migrate; migrate(sys.argv[1])",
            url,
        ],
        cwd=old,
        env={**os.environ, "PYTHONPATH": str(old)},
        check=True,
        timeout=120,
    )


def _upgrade_under_webhooks(pg_server: Server, tmp_path: Path, sessions: int, hold_seconds: float) -> None:
    old = checkout(RELEASES[0], tmp_path / "release", new_schema=False)
    name, url = pg_server.fresh_database()
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:  # an empty one, not the template
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        _old_migrate(old, url)  # the release's schema
        settings = api_settings(
            LINEAR_API_URL="http://127.0.0.1:9/graphql",
            DEVPILOT_STATEMENT_TIMEOUT_MS=600_000,
            DEVPILOT_SWEEP_DEADLINE_SECONDS=3600,
        )
        with open_pool(url, settings, max_size=4) as pool:
            seed(pool, settings, sessions)  # (org `bench`, connected to Linear: its webhooks write posts)
        port = free_port()
        server = start_serve(url, port, {"LINEAR_API_URL": "http://127.0.0.1:9/graphql"}, root=old)
        base = f"http://127.0.0.1:{port}"
        latencies: list[tuple[float, int]] = []
        stop = threading.Event()
        try:
            wait_healthy(base)
            with httpx.Client(base_url=base, timeout=10) as http:
                api = Api(base, settings, None, http)  # type: ignore[arg-type]
                api.register(org="bench", user="u-live", name="live-box")

                def send() -> None:
                    with httpx.Client(base_url=base, timeout=10) as mine:
                        sender = Api(base, settings, None, mine)  # type: ignore[arg-type]
                        n = 0
                        while not stop.is_set():
                            n += 1
                            hook: dict[str, Any] = (
                                issue_event(issue_id=f"live-{n}", assignee="u-live", org="bench")
                                if n % 2
                                else agent_session_event(
                                    org="bench", creator="u-live", session_id=f"as-live-{n}"
                                )
                            )
                            t0 = time.monotonic()
                            r = sender.webhook(hook)
                            latencies.append((time.monotonic() - t0, r.status_code))

                senders = [threading.Thread(target=send) for _ in range(2)]
                for t in senders:
                    t.start()
                time.sleep(1)  # webhooks flowing before the upgrade starts
                applied: list[str] = []
                with psycopg.connect(url) as holder:
                    if hold_seconds:  # a transaction writing both tables, open when the upgrade starts
                        holder.execute("LOCK TABLE dispatch_sessions, linear_notices IN ROW EXCLUSIVE MODE")
                    during = len(latencies)
                    upgrade = threading.Thread(target=lambda: applied.extend(migrate(url)))
                    upgrade.start()
                    time.sleep(hold_seconds)
                    holder.rollback()
                    upgrade.join(timeout=600)
                sent_during = len(latencies) - during
                time.sleep(1)  # the release goes on serving on the new schema
                stop.set()
                for t in senders:
                    t.join(timeout=30)
        finally:
            stop.set()
            server.terminate()
            server.wait(timeout=30)
        assert applied == [
            m.version for m in discover(SCHEMA / "migrations") if int(m.version[:4]) >= FIRST_UNRELEASED
        ], applied
        statuses = {s for _, s in latencies}
        slowest = max(t for t, _ in latencies)
        print(
            f"{sessions:,} sessions: {len(latencies)} webhooks, {sent_during} during the upgrade, slowest {slowest:.3f} s"
        )
        assert statuses == {200}, statuses
        assert sent_during >= 5, sent_during
        assert slowest < ONE_SECOND, f"a webhook waited {slowest:.2f} s of {len(latencies)}"
    finally:
        pg_server.drop(name)


def test_the_release_keeps_taking_webhooks_while_the_database_upgrades(
    pg_server: Server, tmp_path: Path
) -> None:
    _upgrade_under_webhooks(pg_server, tmp_path, sessions=20_000, hold_seconds=3.0)


@pytest.mark.heavy
def test_upgrading_a_million_sessions_under_webhooks(pg_server: Server, tmp_path: Path) -> None:
    _upgrade_under_webhooks(pg_server, tmp_path, sessions=1_000_000, hold_seconds=3.0)
