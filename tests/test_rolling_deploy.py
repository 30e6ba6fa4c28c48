"""The window of a rolling deploy: the database is migrated first, and the instances of the release
before keep serving on the new schema until each is replaced (docs/operating.md). So the code as it
was before each new migration, run on the schema after every migration, passes its own HTTP
contract tests: its own `tests/test_http.py`, from the repository's history, whose test databases
are migrated with today's migrations. Always on: the release the new migrations upgrade, a part of
its contract (webhooks of both kinds, a re-assignment, claims, acks single and batched, a release,
the sweep's backoff and dead letter); heavy lane (DEVPILOT_HEAVY=1): the whole file, for the code before each new migration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.plumbing.migrate import SCHEMA, discover
from tests.helpers.pg import Server
from tests.helpers.releases import before_each_migration, checkout, migrate_module

RELEASES = before_each_migration()
pytestmark = pytest.mark.skipif(not RELEASES, reason="the repository's history is not here (shallow clone)")
PART = (
    "assignment_dispatches or agent_session_created_dispatches or reassignment_cancels or ack_contract"
    " or batch_ack or test_release or lease_expiry_backoff"
)


def _old_contract(pg_server: Server, commit: str, folder: Path, select: str | None) -> str:
    old = checkout(commit, folder, new_schema=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(PYTHONPATH=str(old), TEST_DATABASE_URL=pg_server.admin_url)
    migrations = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from {migrate_module(old)} import SCHEMA, discover; print(len(discover(SCHEMA / 'migrations')))",
        ],
        cwd=old,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert int(migrations.stdout) == len(discover(SCHEMA / "migrations"))  # (it migrates to today's schema)
    args = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_http.py",
        "-q",
        "-x",
        "-n",
        "0",
        "-p",
        "no:cacheprovider",
    ]
    run = subprocess.run(
        args + (["-k", select] if select else []),
        cwd=old,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, f"{commit}:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}"
    return run.stdout


def test_the_release_passes_its_contract_tests_on_the_new_schema(pg_server: Server, tmp_path: Path) -> None:
    out = _old_contract(pg_server, RELEASES[0], tmp_path / "release", PART)
    assert " passed" in out and "deselected" in out, out[-500:]


@pytest.mark.heavy
@pytest.mark.parametrize("commit", RELEASES)
def test_the_code_before_each_new_migration_passes_its_contract_tests(
    pg_server: Server, tmp_path: Path, commit: str
) -> None:
    _old_contract(pg_server, commit, tmp_path / commit[:12], None)
