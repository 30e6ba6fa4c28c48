"""The start journal: which message ids this machine has taken, acked and started.

Order for every message: record (fsync) -> ack -> mark acked -> write the message file -> mark
starting -> spawn a tiny launcher that creates a `started/<messageId>` marker, then execs COMMAND
with the message file on stdin -> mark started.
- a redelivered id that is already `started` is acked again and never started again;
- an `acked` id not yet `started` (a crash between ack and start) is started on the next run;
- a `journaled` id may or may not have been acked (a crash around the ack): on the next run it is
  acked again with its claim token — the service answers `acked` again for a repeated ack — and
  started; a 409 or 404 forgets it (a newer claim will redeliver it, or it was cancelled).
- a `starting` id is started on the next run only if its marker does not exist: the launcher, a
  child in its own session, writes the marker before COMMAND runs and survives the orchestrator's
  death, so a crash anywhere around the fork neither loses nor doubles the start.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

State = Literal["journaled", "acked", "starting", "started"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    message_id  TEXT PRIMARY KEY,
    queue_id    TEXT NOT NULL,
    claim_token TEXT NOT NULL,
    identifier  TEXT,
    message     TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('journaled', 'acked', 'starting', 'started')),
    updated_at  REAL NOT NULL
)"""


def private_dir(path: Path) -> Path:
    """A folder only this user can enter: the state holds issue texts and claim tokens."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)  # also when an older version made it with the default mode
    return path


@dataclass(frozen=True)
class Entry:
    message_id: str
    queue_id: str
    claim_token: str
    state: State
    message: dict[str, Any]


class Journal:
    def __init__(self, path: Path) -> None:
        private_dir(path.parent)
        # Owner-only before SQLite opens it; SQLite gives its -wal and -shm files the same mode.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # every commit is on disk before we go on
        self._db.execute(SCHEMA)

    def get(self, message_id: str) -> Entry | None:
        with self._lock:
            row = self._db.execute(
                "SELECT message_id, queue_id, claim_token, state, message FROM journal WHERE message_id = ?",
                (message_id,),
            ).fetchone()
        return None if row is None else Entry(row[0], row[1], row[2], row[3], json.loads(row[4]))

    def record(self, message: dict[str, Any]) -> None:
        """Before the ack: this claim of the message (a newer claim token replaces an older one)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO journal (message_id, queue_id, claim_token, identifier, message, state, updated_at)"
                " VALUES (?, ?, ?, ?, ?, 'journaled', ?)"
                " ON CONFLICT (message_id) DO UPDATE SET claim_token = excluded.claim_token,"
                " queue_id = excluded.queue_id, message = excluded.message, updated_at = excluded.updated_at"
                " WHERE journal.state = 'journaled'",
                (
                    message["messageId"],
                    message["queueId"],
                    message["claimToken"],
                    (message.get("issue") or {}).get("identifier"),
                    json.dumps(message),
                    time.time(),
                ),
            )

    def mark(self, message_id: str, state: State) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE journal SET state = ?, updated_at = ? WHERE message_id = ?",
                (state, time.time(), message_id),
            )

    def forget(self, message_id: str) -> None:
        """A never-acked claim that lost (409) or whose row is gone (404)."""
        with self._lock:
            self._db.execute(
                "DELETE FROM journal WHERE message_id = ? AND state = 'journaled'", (message_id,)
            )

    def unfinished(self) -> list[Entry]:
        """Entries a crash may have interrupted: journaled (the ack may or may not have reached the
        service) and acked (not yet started), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT message_id, queue_id, claim_token, state, message FROM journal"
                " WHERE state IN ('journaled', 'acked', 'starting') ORDER BY updated_at"
            ).fetchall()
        return [Entry(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def started_in(self, agent_session_id: str) -> list[str]:
        """Message ids of an agent session this machine started (or was starting): a stop ends them."""
        with self._lock:
            rows = self._db.execute(
                "SELECT message_id FROM journal WHERE state IN ('starting', 'started')"
                " AND json_extract(message, '$.agentSessionId') = ? ORDER BY updated_at",
                (agent_session_id,),
            ).fetchall()
        return [r[0] for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
