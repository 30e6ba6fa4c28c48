"""`python -m bench.waits`' sampler counts what a database's backends are doing (bench/README,
"Where a webhook waits"): a backend asleep in a statement reads as one, and another database's
work is not counted."""

from __future__ import annotations

import threading

import psycopg
import pytest

from bench.waits import Sampler, _dbname, main
from tests.helpers.pg import Server


def test_a_backend_busy_in_a_statement_reads_as_one(pg_server: Server, db_url: str) -> None:
    sampler = Sampler(pg_server.admin_url, _dbname(db_url))
    with psycopg.connect(db_url, autocommit=True) as busy, psycopg.connect(db_url, autocommit=True):
        sleeper = threading.Thread(target=lambda: busy.execute("SELECT pg_sleep(0.4)"))
        sleeper.start()
        # (the admin database's own work is another database's: not counted)
        with psycopg.connect(pg_server.admin_url, autocommit=True) as other:
            other.execute("SELECT pg_sleep(0.4)")
        sleeper.join()
    backends = sampler.stop()
    assert sampler.samples > 20
    assert backends["active / Timeout / PgSleep"] > 0.5  # one backend, asleep most of the window
    assert backends["active / Timeout / PgSleep"] <= 1.0  # and not the admin database's
    assert backends["idle / Client / ClientRead"] > 0.5  # the second connection, waiting for us


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match=r"KIND: one of .*blend, enqueue"):
        main(["nope"])
