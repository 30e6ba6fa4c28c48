"""A tiny migration runner: ordered plain-SQL files, each applied once and recorded.

The files ship inside the installed package (`infra/migrations/`, and `infra/supabase/` where
Supabase's schemas exist), so `pip install .` followed by `devpilot migrate` from any directory
applies them. Safe when several instances start at once: the whole run holds a transaction-level
advisory lock, so the second runner waits, then finds everything recorded and applies nothing.
Each file runs in the same transaction as its record, so a failed file leaves no trace and is
retried next time.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from psycopg import sql

from shared.db import connect, transaction
from shared.sql import query

_LOCK_KEY = 0x64657670  # "devp": one advisory lock id for every devpilot migration run
SCHEMA = Path(str(resources.files("infra")))


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


def discover(folder: Path, prefix: str = "") -> list[Migration]:
    return [Migration(prefix + p.stem, p) for p in sorted(folder.glob("[0-9][0-9][0-9][0-9]_*.sql"))]


def migrate(url: str) -> list[str]:
    """Apply what is missing; return the versions applied by this call (empty when up to date)."""
    pending = discover(SCHEMA / "migrations")
    if not pending:  # a broken install must not report "up to date"
        raise RuntimeError(f"no migrations found under {SCHEMA / 'migrations'}; the package is incomplete")
    applied_now: list[str] = []
    with connect(url) as conn, transaction(conn) as tx:
        tx.execute(query("migrations_lock"), {"key": _LOCK_KEY})
        tx.execute(query("migrations_ledger"))
        done = {r["version"]: r["checksum"] for r in tx.all(query("migrations_applied"))}
        has_supabase = tx.one(query("migrations_has_supabase"))
        if has_supabase and has_supabase["ok"]:
            pending += discover(SCHEMA / "supabase", prefix="supabase/")
        for m in pending:
            if m.version in done:
                if done[m.version] != m.checksum:
                    raise RuntimeError(f"migration {m.version} changed after it was applied; add a new one")
                continue
            tx.execute(sql.SQL(m.text))  # our own shipped file, not input
            tx.execute(query("migrations_record"), {"version": m.version, "checksum": m.checksum})
            applied_now.append(m.version)
        if has_supabase and has_supabase["ok"]:
            # Every run, after every migration: row-level security on every table, and Supabase's
            # client roles granted nothing but the one policy-filtered SELECT Realtime needs.
            tx.execute(sql.SQL((SCHEMA / "supabase" / "lockdown.sql").read_text(encoding="utf-8")))
    return applied_now
