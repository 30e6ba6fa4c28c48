"""Supabase SQL: applied only where Supabase's schemas exist, and RLS shows each orchestrator its rows.

The database here is plain Postgres made to look like Supabase where it matters to the policy: a
`realtime` schema, the `authenticated` role, and claims in `request.jwt.claims` (as PostgREST and
Realtime set them).
"""

from __future__ import annotations

import json
import os

import psycopg
import pytest

from shared.delivery.realtime import mint
from shared.plumbing.db import open_pool
from shared.plumbing.migrate import migrate
from shared.plumbing.settings import Settings
from tests.helpers.data import Orch, enqueue_one
from tests.helpers.pg import Server


def test_plain_postgres_gets_no_supabase_sql(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT relrowsecurity FROM pg_class WHERE relname = 'dispatch_queue'").fetchone()
    assert row == (False,)


def test_rls_shows_an_orchestrator_only_its_rows(pg_server: Server) -> None:
    name = "devpilot_supa_" + os.urandom(4).hex()
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'authenticated')"
            " THEN CREATE ROLE authenticated NOLOGIN; END IF; END $$"
        )
    url = pg_server.url_for(name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA realtime")
        applied = migrate(url)
        assert "supabase/0001_realtime" in applied
        pool = open_pool(url, Settings(), max_size=2)
        from shared.fleet.orchestrators import register

        a = register(pool, org_id="org-a", linear_user_id="u", name="a")
        b = register(pool, org_id="org-b", linear_user_id="u", name="b")
        enqueue_one(pool, Orch(a.id, a.token, "org-a", "u"), 1)
        enqueue_one(pool, Orch(b.id, b.token, "org-b", "u"), 2)
        pool.close()
        settings = Settings(SUPABASE_URL="x", SUPABASE_ANON_KEY="y", SUPABASE_JWT_SECRET="z" * 32)
        import jwt

        claims = jwt.decode(
            mint(settings, a.id, "org-a").token, "z" * 32, algorithms=["HS256"], audience="authenticated"
        )
        with psycopg.connect(url) as conn:
            conn.execute("SET ROLE authenticated")
            conn.execute("SELECT set_config('request.jwt.claims', %s, true)", (json.dumps(claims),))
            seen = conn.execute("SELECT orchestrator_id FROM dispatch_queue").fetchall()
            assert seen == [(a.id,)]
            conn.execute("SELECT set_config('request.jwt.claims', '{}', true)")
            assert conn.execute("SELECT count(*) FROM dispatch_queue").fetchone() == (0,)
        with psycopg.connect(url) as conn:
            pub = conn.execute(
                "SELECT tablename FROM pg_publication_tables WHERE pubname = 'supabase_realtime'"
            )
            assert pub.fetchall() == [("dispatch_queue",)]
        assert migrate(url) == []
    finally:
        pg_server.drop(name)


def test_es256_tokens_carry_the_key_id() -> None:
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    settings = Settings(
        SUPABASE_URL="x", SUPABASE_ANON_KEY="y", SUPABASE_JWT_PRIVATE_KEY=pem, SUPABASE_JWT_KID="key-1"
    )
    assert settings.realtime_enabled
    from uuid import uuid4

    oid = uuid4()
    minted = mint(settings, oid, "org-a")
    assert jwt.get_unverified_header(minted.token) == {"alg": "ES256", "kid": "key-1", "typ": "JWT"}
    claims = jwt.decode(minted.token, key.public_key(), algorithms=["ES256"], audience="authenticated")
    assert claims["orchestrator_id"] == str(oid) and claims["role"] == "authenticated"
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(
            minted.token,
            ec.generate_private_key(ec.SECP256R1()).public_key(),
            algorithms=["ES256"],
            audience="authenticated",
        )


SUPABASE_DEFAULTS = """
GRANT USAGE ON SCHEMA public TO anon, authenticated;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO anon, authenticated;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON SEQUENCES TO anon, authenticated;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON FUNCTIONS TO anon, authenticated;
"""


def test_supabase_client_roles_get_nothing_but_their_own_queue_rows(pg_server: Server) -> None:
    """With Supabase's default grants (every new table in `public` to `anon` and `authenticated`),
    a machine's Realtime token reads its own queue rows and nothing else: no credentials, no token
    hashes, no sessions, no other org's rows, and it writes nothing. A table added later is covered."""
    from psycopg import errors

    name = "devpilot_supa_" + os.urandom(4).hex()
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        for role in ("anon", "authenticated"):
            conn.execute(
                f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}')"
                f" THEN CREATE ROLE {role} NOLOGIN; END IF; END $$"
            )
    url = pg_server.url_for(name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA realtime")
            conn.execute(SUPABASE_DEFAULTS)
        migrate(url)
        pool = open_pool(url, Settings(), max_size=2)
        from shared.fleet.orchestrators import register

        a = register(pool, org_id="org-a", linear_user_id="u", name="a")
        b = register(pool, org_id="org-b", linear_user_id="u", name="b")
        enqueue_one(pool, Orch(a.id, a.token, "org-a", "u"), 1)
        enqueue_one(pool, Orch(b.id, b.token, "org-b", "u"), 2)
        with pool.connection() as service:
            service.execute("INSERT INTO linear_credentials (org_id, token_encrypted) VALUES ('org-b', 'x')")
        pool.close()
        settings = Settings(SUPABASE_URL="x", SUPABASE_ANON_KEY="y", SUPABASE_JWT_SECRET="z" * 32)
        import jwt

        claims = jwt.decode(
            mint(settings, a.id, "org-a").token, "z" * 32, algorithms=["HS256"], audience="authenticated"
        )

        def as_client(role: str, statement: str) -> object:
            with psycopg.connect(url) as conn:
                conn.execute(f"SET ROLE {role}")
                conn.execute("SELECT set_config('request.jwt.claims', %s, true)", (json.dumps(claims),))
                return conn.execute(statement).fetchall()

        with psycopg.connect(url, autocommit=True) as conn:
            tables = [
                t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ]
        assert {"orchestrators", "linear_credentials", "dispatch_sessions", "dispatch_queue"} <= set(tables)

        def assert_locked(all_tables: list[str]) -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                no_rls = conn.execute(
                    "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace"
                    " AND relkind = 'r' AND NOT relrowsecurity"
                ).fetchall()
            assert no_rls == []  # every table, including any a later migration adds
            for table in all_tables:
                for role in ("anon", "authenticated"):
                    if (table, role) == ("dispatch_queue", "authenticated"):
                        continue
                    with pytest.raises(errors.InsufficientPrivilege):
                        as_client(role, f"SELECT * FROM {table}")

        def assert_no_function_runs() -> None:
            """Neither client role may run any of devpilot's functions, whatever grants them:
            PUBLIC's default, or Supabase's default privileges for the client roles by name.
            (Asked of the catalogue: calling one would fail on a locked table inside it anyway.)"""
            with psycopg.connect(url, autocommit=True) as conn:
                runnable = conn.execute(
                    "SELECT r.rolname, p.oid::regprocedure::text FROM pg_proc p"
                    " CROSS JOIN pg_roles r WHERE p.pronamespace = 'public'::regnamespace"
                    " AND p.proname LIKE 'devpilot\\_%' AND r.rolname IN ('anon', 'authenticated')"
                    " AND has_function_privilege(r.oid, p.oid, 'EXECUTE')"
                ).fetchall()
                counted = conn.execute(
                    "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
                    " AND proname LIKE 'devpilot\\_%'"
                ).fetchone()
            assert counted is not None and counted[0] >= 10  # (the functions are there to ask about)
            assert runnable == []

        assert_locked(tables)
        assert as_client("authenticated", "SELECT orchestrator_id FROM dispatch_queue") == [(a.id,)]
        for write in (
            f"UPDATE orchestrators SET token_hash = 'x' WHERE id = '{b.id}'",
            "DELETE FROM dispatch_queue",
            "INSERT INTO linear_credentials (org_id, token_encrypted) VALUES ('org-a', 'y')",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                as_client("authenticated", write)
        assert_no_function_runs()

        # a table a later migration adds is locked by the next `devpilot migrate` too
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE added_later (id int)")
        migrate(url)
        assert_locked([*tables, "added_later"])
    finally:
        pg_server.drop(name)
