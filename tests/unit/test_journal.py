"""The orchestrator's start journal is durable before it acts: every record is on disk (WAL,
synchronous=FULL) before the ack that follows it, so a power cut cannot forget a started message."""

from __future__ import annotations

from pathlib import Path

from orchestrator.journal import Journal


def test_the_journal_commits_to_disk_before_it_returns(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    mode = journal._db.execute("PRAGMA journal_mode").fetchone()[0]
    sync = journal._db.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, sync) == ("wal", 2)  # 2 = FULL: fsync at every commit, in WAL mode too
    journal.close()
