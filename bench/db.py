"""The bench's databases: fresh ones on one server, so every figure of a run shares the machine."""

from __future__ import annotations

import os
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shared.plumbing.migrate import migrate


class BenchServer:
    def __init__(self) -> None:
        url = (
            os.environ.get("BENCH_DATABASE_URL")
            or os.environ.get("TEST_DATABASE_URL")
            or os.environ.get("DATABASE_URL")
        )
        self._keep: Any = None
        if not url:
            try:
                with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=2):
                    url = "postgresql://postgres@127.0.0.1:5432/postgres"
            except psycopg.Error:
                import tempfile

                import pgserver

                self._keep = pgserver.get_server(
                    tempfile.mkdtemp(prefix="devpilot-bench-"), cleanup_mode="delete"
                )
                url = self._keep.get_uri()
        self.admin_url = url
        self.made: list[str] = []
        with psycopg.connect(url) as conn:
            self.version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]

    def fresh(self, label: str, migrated: bool = True) -> str:
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.made.append(name)
        url = make_conninfo(self.admin_url, dbname=name)
        if migrated:
            migrate(url)
        return url

    def close(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for name in self.made:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if self._keep is not None:
            self._keep.cleanup()


def as_url(conninfo: str) -> str:
    """A postgresql:// URL for libraries (asyncpg) that do not read key=value conninfo."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    d = conninfo_to_dict(conninfo)
    user = quote(str(d.get("user", "postgres")))
    pw = f":{quote(str(d['password']))}" if d.get("password") else ""
    host = str(d.get("host", "127.0.0.1"))
    port = d.get("port", "5432")
    db = d.get("dbname", "postgres")
    if host.startswith("/"):
        return f"postgresql://{user}{pw}@/{db}?host={quote(host)}&port={port}"
    return f"postgresql://{user}{pw}@{host}:{port}/{db}"
