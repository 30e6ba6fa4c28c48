"""Connecting a Linear workspace with OAuth and keeping it alive, against a stand-in Linear whose
tokens expire and whose refresh tokens rotate (a reused one is refused)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.fernet import Fernet, MultiFernet
from pytest_httpserver import HTTPServer

from shared.plumbing import crypto
from shared.plumbing.db import Pool
from tests.helpers.api import ADMIN, Api, agent_session_event, app_revoked_event
from tests.helpers.data import ENCRYPTION_KEY, row_counts, write_notice
from tests.helpers.linear import LinearOAuth

ORG = LinearOAuth.ORG["id"]


def linear_env(httpserver: HTTPServer) -> dict[str, Any]:
    return {
        "LINEAR_API_URL": httpserver.url_for("/graphql"),
        "LINEAR_OAUTH_TOKEN_URL": httpserver.url_for("/oauth/token"),
        "LINEAR_OAUTH_AUTHORIZE_URL": "https://linear.example/oauth/authorize",
        "LINEAR_CLIENT_ID": "client-id",
        "LINEAR_CLIENT_SECRET": "client-secret",
        "DEVPILOT_PUBLIC_URL": "https://devpilot.example",
    }


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return linear_env(httpserver)


@pytest.fixture
def linear(httpserver: HTTPServer) -> LinearOAuth:
    return LinearOAuth(httpserver)


def install(api: Api, code: str = "good-code") -> httpx.Response:
    r = api.http.get("/oauth/install")
    assert r.status_code == 302
    state = parse_qs(urlsplit(r.headers["Location"]).query)["state"][0]
    return api.http.get("/oauth/callback", params={"code": code, "state": state})


def credentials(pool: Pool) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute("SELECT * FROM linear_credentials WHERE org_id = %s", (ORG,)).fetchone()
    assert row is not None
    return dict(row)


def agent_post(api: Api, session: str) -> None:
    """An agent session for a machine of the OAuth org: the service's first thought goes to Linear."""
    r = api.webhook(agent_session_event(org=ORG, session_id=session))
    assert r.json()["status"] == "dispatched", r.text


def test_install_redirects_to_linear_with_the_agent_scopes(api: Api, linear: LinearOAuth) -> None:
    r = api.http.get("/oauth/install")
    assert r.status_code == 302
    url = urlsplit(r.headers["Location"])
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert f"{url.scheme}://{url.netloc}{url.path}" == "https://linear.example/oauth/authorize"
    assert q["client_id"] == "client-id" and q["response_type"] == "code" and q["actor"] == "app"
    assert q["redirect_uri"] == "https://devpilot.example/oauth/callback"
    assert {"read", "write", "app:assignable", "app:mentionable"} <= set(q["scope"].split(","))
    assert (
        q["state"]
        and q["state"]
        != parse_qs(urlsplit(api.http.get("/oauth/install").headers["Location"]).query)["state"][0]
    )


def test_a_bad_or_expired_state_is_400_and_linear_hears_nothing(api: Api, linear: LinearOAuth) -> None:
    old = MultiFernet([Fernet(ENCRYPTION_KEY)]).encrypt_at_time(
        b"devpilot-oauth-state:x", int(time.time()) - 11 * 60
    )
    other_key = Fernet(Fernet.generate_key()).encrypt(b"devpilot-oauth-state:x")
    for state in ("forged", old.decode(), other_key.decode(), ""):
        r = api.http.get("/oauth/callback", params={"code": "good-code", "state": state})
        assert r.status_code == 400, state
    assert linear.exchanges == [] and row_counts(api.pool)["notices"] == 0
    with api.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM linear_credentials").fetchone() == {"n": 0}


def test_callback_stores_encrypted_tokens_and_posts_with_them(api: Api, linear: LinearOAuth) -> None:
    r = install(api)
    assert r.status_code == 200 and "Acme Robotics" in r.text
    [exchange] = linear.exchanges
    assert exchange["grant_type"] == "authorization_code"
    assert exchange["redirect_uri"] == "https://devpilot.example/oauth/callback"
    row = credentials(api.pool)
    assert (
        row["kind"] == "oauth" and row["disconnected_at"] is None and row["workspace_name"] == "Acme Robotics"
    )
    assert row["app_user_id"] == LinearOAuth.APP_USER  # learned once at install: the delegate it sets
    for column in ("token_encrypted", "refresh_token_encrypted"):
        assert b"acc-1" not in bytes(row[column]) and b"ref-1" not in bytes(row[column])  # not in a dump
    assert 23 * 3600 < (row["expires_at"].timestamp() - time.time()) <= 24 * 3600
    listed = api.http.get("/linear-credentials", headers=api.admin()).json()["orgs"]
    assert listed[0]["connected"] is True and "acc-1" not in json.dumps(listed)
    api.register(org=ORG, user="user-1")
    agent_post(api, "as-o1")
    linear.wait(1)
    assert linear.auth[-1] == "Bearer acc-1"


def test_a_refused_exchange_is_502_and_stores_nothing(api: Api, linear: LinearOAuth) -> None:
    assert install(api, code="bad-code").status_code == 502
    with api.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM linear_credentials").fetchone() == {"n": 0}


def test_a_token_near_expiry_is_refreshed_once_before_use(api: Api, linear: LinearOAuth) -> None:
    install(api)
    with api.pool.connection() as conn:
        conn.execute("UPDATE linear_credentials SET expires_at = now() + interval '2 minutes'")
    api.register(org=ORG, user="user-1")
    agent_post(api, "as-o2")
    agent_post(api, "as-o3")
    linear.wait(2)
    assert linear.refreshes == 1 and linear.refused == []
    assert set(linear.auth) == {"Bearer acc-2"}  # never the expiring one
    row = credentials(api.pool)
    assert row["expires_at"].timestamp() - time.time() > 23 * 3600


def test_a_401_is_refreshed_once_and_the_post_retried(api: Api, linear: LinearOAuth) -> None:
    install(api)
    linear.expire_all()  # Linear no longer takes acc-1 although it is not yet due
    api.register(org=ORG, user="user-1")
    agent_post(api, "as-o4")
    linear.wait(1)
    assert linear.refreshes == 1 and linear.auth[-2:] == ["Bearer acc-1", "Bearer acc-2"]


def test_a_refused_refresh_disconnects_and_posts_wait_for_a_new_install(
    api: Api, linear: LinearOAuth
) -> None:
    install(api)
    linear.refuse_refresh = True
    linear.expire_all()
    api.register(org=ORG, user="user-1")
    agent_post(api, "as-o5")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and credentials(api.pool)["disconnected_at"] is None:
        time.sleep(0.05)
    assert credentials(api.pool)["disconnected_at"] is not None
    listed = api.http.get("/linear-credentials", headers=api.admin()).json()["orgs"]
    assert listed[0]["connected"] is False
    # operators see it: devpilot status, the dashboard, /metrics
    from shared.operators.status import snapshot

    [conn_state] = snapshot(api.pool).to_json()["linear"]
    assert conn_state["orgId"] == ORG and conn_state["connected"] is False and conn_state["disconnectReason"]
    assert 'class="bad disconnected"' in api.http.get("/dashboard", headers=api.admin()).text
    api.settings.__dict__["metrics_enabled"] = True
    assert (
        f'devpilot_linear_connected{{org_id="{ORG}"}} 0.0'
        in api.http.get("/metrics", headers=api.admin()).text
    )
    agent_post(api, "as-o6")
    api.http.post("/sweep", headers=api.admin())
    with api.pool.connection() as conn:
        waiting = conn.execute("SELECT attempts, sent_at FROM linear_notices ORDER BY seq").fetchall()
    assert all(n["sent_at"] is None for n in waiting) and len(waiting) == 2  # waiting, not dropped
    assert [n["attempts"] for n in waiting][1] == 0  # not even tried while disconnected
    linear.refuse_refresh = False
    assert install(api).status_code == 200
    linear.wait(2)
    assert {a["agentSessionId"] for a in linear.activities()} == {"as-o5", "as-o6"}
    assert credentials(api.pool)["disconnected_at"] is None


def test_a_post_put_back_to_wait_keeps_its_attempts_and_touches_no_other(
    api: Api, linear: LinearOAuth
) -> None:
    """A post taken while its org's refresh is refused goes back to waiting: its earlier failed
    attempts still count (the limit holds), and no other org's post changes."""
    from shared.linear import notices as outbox

    install(api)
    linear.refuse_refresh = True
    linear.expire_all()
    other = api.http.post(
        "/linear-credentials", json={"orgId": "org-b", "accessToken": "t"}, headers=api.admin()
    )
    assert other.status_code == 200
    mine, theirs = write_notice(api.pool, ORG, "as-w1", "x"), write_notice(api.pool, "org-b", "as-w2", "x")
    with api.pool.connection() as conn:  # two failed posts behind it; theirs waits out a backoff
        conn.execute("UPDATE linear_notices SET attempts = 2, last_error = 'HTTP 500' WHERE id = %s", (mine,))
        conn.execute(
            "UPDATE linear_notices SET attempts = 1, available_at = now() + interval '1 hour' WHERE id = %s",
            (theirs,),
        )
        before = {r["id"]: dict(r) for r in conn.execute("SELECT * FROM linear_notices")}
    assert outbox.send_pending(api.pool, api.settings).sent == 0
    with api.pool.connection() as conn:
        after = {r["id"]: dict(r) for r in conn.execute("SELECT * FROM linear_notices")}
    assert credentials(api.pool)["disconnected_at"] is not None
    assert (
        after[mine]["attempts"] == 2
        and after[mine]["sent_at"] is None
        and after[mine]["lease_expires_at"] is None
    )
    assert after[theirs] == before[theirs]


def test_linear_revoking_the_app_disconnects_the_org(api: Api, linear: LinearOAuth) -> None:
    install(api)
    answer = api.webhook(app_revoked_event(ORG)).json()
    assert answer["status"] == "ignored" and answer["reason"]  # the contract's ignored shape
    assert credentials(api.pool)["disconnect_reason"].startswith("the app was uninstalled")


def test_keys_rotate_and_are_never_derived_from_the_admin_token() -> None:
    from shared.plumbing.settings import Settings

    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    stored = crypto.keys(Settings(DEVPILOT_ENCRYPTION_KEYS=old)).encrypt(b"lin-token")
    rotated = Settings(DEVPILOT_ENCRYPTION_KEYS=f"{new},{old}")
    assert crypto.keys(rotated).decrypt(stored) == b"lin-token"  # every key decrypts
    again = crypto.keys(rotated).rotate(stored)
    assert (
        crypto.keys(Settings(DEVPILOT_ENCRYPTION_KEYS=new)).decrypt(again) == b"lin-token"
    )  # the first writes
    with pytest.raises(crypto.NotConfigured):
        crypto.keys(Settings(DATABASE_URL="postgresql://x/y", DEVPILOT_ADMIN_TOKEN="admin"))


def _keys_at_once(settings: Any, n: int) -> tuple[list[bytes], list[BaseException]]:
    """n threads released together, each encrypting with `crypto.keys`: their tokens, their errors."""
    start = threading.Barrier(n)
    tokens: list[bytes] = []
    errors: list[BaseException] = []

    def one() -> None:
        start.wait()
        try:
            tokens.append(crypto.keys(settings).encrypt(b"x"))
        except BaseException as exc:  # any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens, errors


def test_the_generated_key_is_made_once_when_threads_ask_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the embedded database and no keys set, the first use generates the key file. Threads
    of one process asking at once (the start-up report and a first request, in `devpilot serve`)
    all get that one key, and none of them fails."""
    from shared.plumbing.settings import Settings

    monkeypatch.setenv("DEVPILOT_HOME", str(tmp_path))
    settings = Settings(DEVPILOT_ADMIN_TOKEN="admin")
    for round_ in range(20):
        (tmp_path / "encryption.key").unlink(missing_ok=True)
        tokens, errors = _keys_at_once(settings, 8)
        assert errors == [], f"round {round_}: {errors!r}"
        key = crypto.keys(settings)
        assert [key.decrypt(t) for t in tokens] == [b"x"] * 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["encryption.key"]  # no temporary file left


def test_storing_without_keys_on_a_real_database_is_503(api: Api) -> None:
    api.settings.__dict__["encryption_keys"] = None
    api.settings.__dict__["database_url"] = "postgresql://configured/elsewhere"
    r = api.http.post("/linear-credentials", json={"orgId": "o", "accessToken": "t"}, headers=api.admin())
    assert (r.status_code, r.json()["error"]) == (503, "encryption_not_configured")
    with api.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM linear_credentials").fetchone() == {"n": 0}


def test_two_instances_refreshing_at_once_spend_the_refresh_token_once(api: Api, linear: LinearOAuth) -> None:
    """Two instances (each with its own token cache and connections) find the org's token due at
    the same moment, while Linear takes half a second to answer a refresh: the org's row lock lets
    one refresh, and the other, once the lock is its own, finds the new token and uses it. Without
    the lock both would send the same refresh token; Linear rotates it on use and refuses the
    second, which disconnects the org."""
    from shared.linear.auth import Tokens

    install(api)
    with api.pool.connection() as conn:
        conn.execute("UPDATE linear_credentials SET expires_at = now() + interval '1 minute'")
    linear.refresh_delay = 0.5
    instances = [Tokens(api.pool, api.settings) for _ in range(2)]
    barrier = threading.Barrier(2)
    got: list[str | None] = []

    def use(tokens: Tokens) -> None:
        barrier.wait()
        got.append(tokens.get(ORG))

    threads = [threading.Thread(target=use, args=(t,)) for t in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert linear.refreshes == 1 and linear.refused == []
    assert got == ["acc-2", "acc-2"]
    assert credentials(api.pool)["disconnected_at"] is None


def test_two_service_processes_refreshing_at_once_spend_the_refresh_token_once(
    pool: Pool, db_url: str, httpserver: HTTPServer, tmp_path: Path
) -> None:
    """Two `devpilot serve` processes on one database, both sweeping the posts of an org whose token
    is due: one refresh, no refused (reused) refresh token, every post sent with the new token.
    (Whether both reach the refresh depends on which takes the posts; the test above pins the lock.)"""
    from shared.fleet.orchestrators import register
    from tests.helpers.serving import free_ports, start_serve, wait_healthy

    linear = LinearOAuth(httpserver, refresh_delay=0.5)
    env = {
        **linear_env(httpserver),
        "DEVPILOT_ENCRYPTION_KEYS": ENCRYPTION_KEY,
        "DEVPILOT_HOME": str(tmp_path),
    }
    env = {k: str(v) for k, v in env.items()}
    ports = free_ports(2)
    servers = [start_serve(db_url, p, env) for p in ports]
    try:
        clients = [httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=30) for p in ports]
        for p in ports:
            wait_healthy(f"http://127.0.0.1:{p}")
        r = clients[0].get("/oauth/install")
        state = parse_qs(urlsplit(r.headers["Location"]).query)["state"][0]
        assert (
            clients[1].get("/oauth/callback", params={"code": "good-code", "state": state}).status_code == 200
        )
        register(pool, org_id=ORG, linear_user_id="user-1", name="m")
        with pool.connection() as conn:
            conn.execute("UPDATE linear_credentials SET expires_at = now() + interval '1 minute'")
            conn.execute(
                "INSERT INTO linear_notices (org_id, kind, agent_session_id, body, available_at)"
                " SELECT %s, 'dispatched', 'as-two-' || g, 'hello', now() FROM generate_series(1, 20) g",
                (ORG,),
            )
        barrier = threading.Barrier(2)

        def sweep(c: httpx.Client) -> None:
            barrier.wait()
            c.post("/sweep", headers={"Authorization": f"Bearer {ADMIN}"})

        threads = [threading.Thread(target=sweep, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(linear.calls) < 20:
            time.sleep(0.05)
    finally:
        for s in servers:
            s.kill()
            s.wait()
    assert linear.refreshes == 1 and linear.refused == []
    assert len(linear.calls) == 20 and set(linear.auth) == {"Bearer acc-2"}


def test_disconnecting_one_org_leaves_every_other_org_connected(api: Api) -> None:
    """A refused refresh or an uninstall disconnects that org only: another org's posts keep going."""
    from shared.linear.auth import disconnect
    from shared.plumbing.db import transaction

    for org in ("org-a", "org-b"):
        r = api.http.post(
            "/linear-credentials", json={"orgId": org, "accessToken": f"tok-{org}"}, headers=api.admin()
        )
        assert r.status_code == 200, r.text
    with transaction(api.pool) as tx:
        assert disconnect(tx, "org-a", "the app was uninstalled")
    with api.pool.connection() as conn:
        rows = conn.execute(
            "SELECT org_id, disconnected_at FROM linear_credentials ORDER BY org_id"
        ).fetchall()
    assert [(r["org_id"], r["disconnected_at"] is not None) for r in rows] == [
        ("org-a", True),
        ("org-b", False),
    ]
