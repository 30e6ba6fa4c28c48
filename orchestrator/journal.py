"""The journal: which message ids this machine has taken, handed to their conversation, acked
and started.

Order for every message but a stop: record (fsync) -> write it into its conversation's inbox
(`orchestrator.conversations`: once ever, however often this runs) -> mark inboxed -> ack -> mark
delivered. Then, when no COMMAND of its conversation runs and a slot is free: mark starting ->
spawn a tiny launcher that creates a `started/<messageId>` marker, removes the message from the
inbox and execs COMMAND with it on stdin -> mark started. (While a COMMAND of the conversation
runs, the message waits in the inbox, where that COMMAND can read it.)
- a redelivered id that is already inboxed, delivered or started is acked again, never handed over
  or started again;
- a `journaled` id may or may not be in the inbox (a crash around the write): on the next run the
  write is made, or found made, and the id acked; a 404 then takes it out of the inbox unread (it
  was cancelled) and forgets it; a 409 keeps it (a newer claim redelivers it, and that is acked);
- an `inboxed` id may or may not have been acked (a crash around the ack): on the next run it is
  acked again with its claim token — the service answers `acked` again for a repeated ack;
- a `starting` id is started on the next run only if its marker does not exist: the launcher, a
  child in its own session, writes the marker before COMMAND runs and survives the orchestrator's
  death, so a crash anywhere around the fork neither loses nor doubles the start.
- a stop: record -> ack -> end the conversation's processes -> mark started.
(`acked`: a journal from before the inbox, a start acked and not yet started; started on the next run.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from orchestrator.state import private_dir

State = Literal["journaled", "inboxed", "delivered", "acked", "starting", "started"]
# What a crash may have interrupted (`Journal.unfinished`); the rest is handed over for good.
UNFINISHED: tuple[State, ...] = ("journaled", "inboxed", "acked", "starting")

SCHEMA = """
CREATE TABLE IF NOT EXISTS journal (
    message_id  TEXT PRIMARY KEY,
    queue_id    TEXT NOT NULL,
    claim_token TEXT NOT NULL,
    identifier  TEXT,
    message     TEXT NOT NULL,
    state       TEXT NOT NULL
                CHECK (state IN ('journaled', 'inboxed', 'delivered', 'acked', 'starting', 'started')),
    updated_at  REAL NOT NULL
)"""
# A journal written before the inbox allows fewer states: its rows move to the table above.
UPGRADE = """
ALTER TABLE journal RENAME TO journal_before_inbox;
{schema};
INSERT INTO journal SELECT * FROM journal_before_inbox;
DROP TABLE journal_before_inbox;
"""


@dataclass(frozen=True)
class Age:
    """A message as housekeeping sees it: its state, when that last changed, and the ids its
    conversation is known by."""

    message_id: str
    state: State
    updated_at: float
    agent_session_id: str | None
    session_id: str


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
        old = self._db.execute("SELECT sql FROM sqlite_master WHERE name = 'journal'").fetchone()
        if old is not None and "'inboxed'" not in old[0]:
            self._db.executescript("BEGIN;" + UPGRADE.format(schema=SCHEMA.strip()) + "COMMIT;")

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
        """A never-acked claim that lost (409) or whose row is gone (404): it was never delivered."""
        with self._lock:
            self._db.execute(
                "DELETE FROM journal WHERE message_id = ? AND state IN ('journaled', 'inboxed')",
                (message_id,),
            )

    def ages(self) -> list[Age]:
        """Every message here, without its text (housekeeping)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT message_id, state, updated_at, json_extract(message, '$.agentSessionId'),"
                " json_extract(message, '$.sessionId') FROM journal"
            ).fetchall()
        return [Age(r[0], r[1], r[2], r[3], str(r[4])) for r in rows]

    def drop(self, message_ids: list[str]) -> int:
        """Housekeeping: the rows of these messages, if finished (acked into the inbox, or started);
        how many went."""
        with self._lock:
            n = self._db.execute(
                "DELETE FROM journal WHERE message_id IN (SELECT value FROM json_each(?))"
                " AND state IN ('delivered', 'started')",
                (json.dumps(message_ids),),
            ).rowcount
        return int(n)

    def unfinished(self) -> list[Entry]:
        """Entries a crash may have interrupted: journaled (maybe in the inbox, maybe acked),
        inboxed (the ack may or may not have reached the service), acked and starting (maybe not
        started), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT message_id, queue_id, claim_token, state, message FROM journal"
                " WHERE state IN ('journaled', 'inboxed', 'acked', 'starting') ORDER BY updated_at"
            ).fetchall()
        return [Entry(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def started_in(self, conversation: str) -> list[Entry]:
        """The messages of a conversation (an agent session, or a plain assignment's session) this
        machine started COMMAND with (or was starting it with): a stop ends them."""
        return self._of(conversation, ("starting", "started"))

    def in_conversation(self, conversation: str) -> list[Entry]:
        """Every message of the conversation this machine has had (acked), in the service's order."""
        entries = self._of(conversation, ("inboxed", "delivered", "acked", "starting", "started"))
        return sorted(entries, key=lambda e: datetime.fromisoformat(str(e.message.get("createdAt"))))

    def _of(self, conversation: str, states: tuple[str, ...]) -> list[Entry]:
        with self._lock:
            rows = self._db.execute(
                "SELECT message_id, queue_id, claim_token, state, message FROM journal"
                " WHERE state IN (SELECT value FROM json_each(?)) AND coalesce("
                "json_extract(message, '$.agentSessionId'), json_extract(message, '$.sessionId')) = ?"
                " ORDER BY updated_at",
                (json.dumps(states), conversation),
            ).fetchall()
        return [Entry(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()
