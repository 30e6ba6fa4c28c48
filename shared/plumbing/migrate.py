"""A tiny migration runner: ordered plain-SQL files, each applied once and recorded.

The files ship inside the installed package (`infra/migrations/`, and `infra/supabase/` where
Supabase's schemas exist), so `pip install .` followed by `devpilot migrate` from any directory
applies them. Safe when several instances start at once: a run holds an advisory lock on its
connection (asked for again and again, never waited on inside a statement: see `_hold_lock`), so
the second runner waits, then finds everything recorded and applies nothing.

The database is live while it migrates (docs/operating.md): webhooks keep arriving, and instances
of the release before keep running on the new schema until they are replaced. So:

- A file runs in one transaction with its record, so a failed file leaves no trace and is retried
  next time. Each of its statements waits at most `LOCK_TIMEOUT_MS` for a table's lock (an
  `ALTER TABLE` queued behind a long transaction would hold every insert of that table behind
  it); the file is then tried again, up to `LOCK_TRIES` times, so the service waits for it a
  fraction of a second at a time, never for the whole wait.
- A file whose first line is `-- devpilot: no-transaction` runs statement by statement, outside
  any transaction: what `CREATE INDEX CONCURRENTLY` needs, which builds an index on a table that
  grows without holding its writes. It is recorded after its last statement, so one interrupted
  half way is run again from the start: each statement must be idempotent (`IF NOT EXISTS`), and an
  index an interrupted concurrent build left INVALID (it exists, but serves nothing and slows every
  write) is dropped, concurrently too, before its `CREATE INDEX CONCURRENTLY IF NOT EXISTS` runs
  again: `IF NOT EXISTS` alone would keep the broken one for ever.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg
from psycopg import sql

from shared.plumbing.db import Conn, connect, transaction
from shared.plumbing.sql import query

_LOCK_KEY = 0x64657670  # "devp": one advisory lock id for every devpilot migration run
SCHEMA = Path(str(resources.files("infra")))
NO_TRANSACTION = "-- devpilot: no-transaction"
# How long one statement of a transactional file may wait for a table's lock, and how often the
# file is tried again when one does not come (with a pause growing to 2 s: about ten minutes).
LOCK_TIMEOUT_MS = 200
LOCK_TRIES = 300
_CONCURRENT_INDEX = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE
)


@dataclass(frozen=True)
class Migration:
    version: str
    path: Path

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def outside_transaction(self) -> bool:
        return self.text.startswith(NO_TRANSACTION)


def discover(folder: Path, prefix: str = "") -> list[Migration]:
    return [Migration(prefix + p.stem, p) for p in sorted(folder.glob("[0-9][0-9][0-9][0-9]_*.sql"))]


def statements(text: str) -> list[str]:
    """A no-transaction file's statements: each ends with `;` at the end of a line; lines that
    are only a comment are left out. Such a file holds plain statements only (no function bodies,
    whose `;` would end nothing): one with `$$` is refused."""
    if "$$" in text:
        raise ValueError("a no-transaction migration holds plain statements only (no $$ bodies)")
    out: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("--") or not line.strip():
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            out.append("\n".join(current).rstrip().rstrip(";"))
            current = []
    if any(line.strip() for line in current):
        raise ValueError("a statement of a no-transaction migration does not end with ';'")
    return out


def migrate(url: str) -> list[str]:
    """Apply what is missing; return the versions applied by this call (empty when up to date)."""
    pending = discover(SCHEMA / "migrations")
    if not pending:  # a broken install must not report "up to date"
        raise RuntimeError(f"no migrations found under {SCHEMA / 'migrations'}; the package is incomplete")
    applied_now: list[str] = []
    with connect(url) as conn:
        _hold_lock(conn)
        try:
            conn.execute(query("migrations_ledger"))
            done = {r["version"]: r["checksum"] for r in conn.execute(query("migrations_applied"))}
            has_supabase = conn.execute(query("migrations_has_supabase")).fetchone()
            supabase = bool(has_supabase and has_supabase["ok"])
            if supabase:
                pending += discover(SCHEMA / "supabase", prefix="supabase/")
            for m in pending:
                if m.version in done:
                    if done[m.version] != m.checksum:
                        raise RuntimeError(
                            f"migration {m.version} changed after it was applied; add a new one"
                        )
                    continue
                if m.outside_transaction:
                    _apply_outside(conn, m)
                else:
                    _apply_inside(conn, m)
                applied_now.append(m.version)
            if supabase:
                # Every run, after every migration: row-level security on every table, and Supabase's
                # client roles granted nothing but the one policy-filtered SELECT Realtime needs.
                with transaction(conn) as tx:
                    tx.execute(sql.SQL((SCHEMA / "supabase" / "lockdown.sql").read_text(encoding="utf-8")))
        finally:
            if not conn.closed:
                conn.execute(query("migrations_unlock"), {"key": _LOCK_KEY})
    return applied_now


def _hold_lock(conn: Conn) -> None:
    """The run's lock, on this connection until `migrations_unlock` (or the connection ends).
    Tried, not waited for: a statement waiting for a lock holds a snapshot, and a concurrent index
    build waits for every snapshot older than its own, here the waiting runner's, while that runner
    waits for the builder's lock (Postgres would end the circle by failing one of the two)."""
    while True:
        row = conn.execute(query("migrations_try_lock"), {"key": _LOCK_KEY}).fetchone()
        if row is not None and row["locked"]:
            return
        time.sleep(0.2)


def _apply_inside(conn: Conn, m: Migration) -> None:
    """The file and its record in one transaction, each statement waiting at most LOCK_TIMEOUT_MS
    for a lock; tried again (from the start: the failed attempt left nothing) when one did not come."""
    for attempt in range(LOCK_TRIES):
        try:
            with transaction(conn) as tx:
                tx.execute(query("migrations_lock_timeout"), {"ms": LOCK_TIMEOUT_MS})
                tx.execute(sql.SQL(m.text))  # our own shipped file, not input
                tx.execute(query("migrations_record"), {"version": m.version, "checksum": m.checksum})
            return
        except psycopg.errors.LockNotAvailable:
            if attempt == LOCK_TRIES - 1:
                raise
            time.sleep(min(2.0, 0.05 * (attempt + 1)))


def _apply_outside(conn: Conn, m: Migration) -> None:
    """Each statement on its own (the connection is autocommit), no lock or statement limit (a
    concurrent build waits for the transactions already running, and holds no insert meanwhile);
    then the record."""
    conn.execute(query("migrations_no_limits"))
    for statement in statements(m.text):
        built = _CONCURRENT_INDEX.match(statement)
        if built is not None:
            invalid = conn.execute(query("migrations_invalid_index"), {"name": built.group(1)}).fetchone()
            if invalid is not None:  # left by an interrupted build: serves nothing, slows every write
                conn.execute(
                    sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(invalid["name"]))
                )
        conn.execute(sql.SQL(statement))  # (our own shipped file, not input)
    conn.execute(query("migrations_record"), {"version": m.version, "checksum": m.checksum})
