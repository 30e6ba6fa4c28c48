"""Where the tests' Postgres comes from, in order:

1. `TEST_DATABASE_URL` or `DATABASE_URL` if set (CI sets it to the machine's server at 5432);
2. a testcontainers Postgres when a Docker engine answers;
3. an embedded `pgserver` otherwise — so the suite runs on a laptop with nothing installed.

Each test gets its own database cloned from a migrated template, so tests never see each other.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from contextlib import suppress
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from shared.plumbing.migrate import migrate


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


class Server:
    """A Postgres server the tests may create and drop databases on."""

    def __init__(self) -> None:
        self._keep: Any = None
        url = os.environ.get("TEST_DATABASE_URL") or os.environ.get("DATABASE_URL")
        if url:
            self.kind = "given"
        elif _docker_answers():
            from testcontainers.postgres import PostgresContainer

            container = PostgresContainer("postgres:16-alpine", driver=None)
            container.start()
            self._keep = container
            url = container.get_connection_url()
            self.kind = "testcontainers"
        else:
            import pgserver

            folder = tempfile.mkdtemp(prefix="devpilot-test-pg-")
            server = pgserver.get_server(folder, cleanup_mode="delete")
            self._keep = server
            url = server.get_uri()
            self.kind = "pgserver"
        self.admin_url = url
        self.template = f"devpilot_tpl_{uuid.uuid4().hex[:10]}"
        self._create(self.template, template=None)
        migrate(self.url_for(self.template))

    def url_for(self, dbname: str) -> str:
        return make_conninfo(self.admin_url, dbname=dbname)

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_url, autocommit=True)

    def _create(self, name: str, template: str | None) -> None:
        with self._admin() as conn:
            if template:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY file_copy").format(
                        sql.Identifier(name), sql.Identifier(template)
                    )
                    if self._supports_strategy(conn)
                    else sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(template)
                    )
                )
            else:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    @staticmethod
    def _supports_strategy(conn: psycopg.Connection[Any]) -> bool:
        return conn.info.server_version >= 150000

    def fresh_database(self) -> tuple[str, str]:
        name = f"devpilot_t_{uuid.uuid4().hex[:12]}"
        self._create(name, template=self.template)
        return name, self.url_for(name)

    def drop(self, name: str) -> None:
        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def close(self) -> None:
        with suppress(Exception):
            self.drop(self.template)
        if self.kind == "testcontainers" and self._keep is not None:
            self._keep.stop()
        elif self.kind == "pgserver" and self._keep is not None:
            self._keep.cleanup()
