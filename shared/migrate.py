"""A tiny migration runner: ordered plain-SQL files, each applied once and recorded.

Safe when several instances start at once: the whole run holds a transaction-level advisory lock,
so the second runner waits, then finds everything recorded and applies nothing. Each file runs in
the same transaction as its record, so a failed file leaves no trace and is retried next time.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from psycopg import sql

from shared.db import connect, transaction

_LOCK_KEY = 0x64657670  # "devp": one advisory lock id for every devpilot migration run
ROOT = Path(__file__).resolve().parent.parent

CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS devpilot_migrations (
    version     text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)"""
LOCK = "SELECT pg_advisory_xact_lock(%(key)s)"
APPLIED = "SELECT version, checksum FROM devpilot_migrations"
RECORD = "INSERT INTO devpilot_migrations (version, checksum) VALUES (%(version)s, %(checksum)s)"
HAS_SUPABASE = (
    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'realtime')"
    " AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated') AS ok"
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


def migrations_dir() -> Path:
    return Path(os.environ.get("DEVPILOT_MIGRATIONS_DIR", ROOT / "infra" / "migrations"))


def supabase_dir() -> Path:
    return ROOT / "infra" / "supabase"


def discover(folder: Path, prefix: str = "") -> list[Migration]:
    return [Migration(prefix + p.stem, p) for p in sorted(folder.glob("[0-9][0-9][0-9][0-9]_*.sql"))]


def migrate(url: str) -> list[str]:
    """Apply what is missing; return the versions applied by this call (empty when up to date)."""
    applied_now: list[str] = []
    with connect(url) as conn, transaction(conn) as tx:
        tx.execute(LOCK, {"key": _LOCK_KEY})
        tx.execute(CREATE_LEDGER)
        done = {r["version"]: r["checksum"] for r in tx.all(APPLIED)}
        pending = discover(migrations_dir())
        has_supabase = tx.one(HAS_SUPABASE)
        if has_supabase and has_supabase["ok"] and supabase_dir().is_dir():
            pending += discover(supabase_dir(), prefix="supabase/")
        for m in pending:
            if m.version in done:
                if done[m.version] != m.checksum:
                    raise RuntimeError(f"migration {m.version} changed after it was applied; add a new one")
                continue
            tx.execute(sql.SQL(m.text))  # our own shipped file, not input
            tx.execute(RECORD, {"version": m.version, "checksum": m.checksum})
            applied_now.append(m.version)
    return applied_now
