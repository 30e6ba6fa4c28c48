from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from shared.fleet.orchestrators import register
from shared.plumbing.db import Pool, open_pool
from shared.plumbing.settings import Settings
from tests.helpers import bouncer
from tests.helpers.api import Api
from tests.helpers.data import MakeOrch, Orch, api_settings
from tests.helpers.git import checkout
from tests.helpers.linear import Linear
from tests.helpers.pg import Server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DEVPILOT_HEAVY") == "1":
        return
    skip = pytest.mark.skip(reason="heavy run: set DEVPILOT_HEAVY=1")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    server = Server()
    if bouncer.POOLER:  # fail (skip) early and clearly when PgBouncer cannot run here
        try:
            bouncer.shared(server.admin_url)
        except bouncer.Unavailable as exc:
            pytest.skip(f"DEVPILOT_TEST_POOLER=pgbouncer, but PgBouncer cannot run here: {exc}")
    yield server
    if bouncer._shared:
        bouncer._shared[0].close()
    server.close()


@pytest.fixture
def db_url(pg_server: Server) -> Iterator[str]:
    name, url = pg_server.fresh_database()
    yield url
    pg_server.drop(name)


@pytest.fixture
def settings() -> Settings:
    return Settings(DATABASE_URL=None)


@pytest.fixture
def pool(db_url: str, settings: Settings) -> Iterator[Pool]:
    p = open_pool(db_url, settings, min_size=1, max_size=20)
    yield p
    p.close()


@pytest.fixture
def make_orchestrator(pool: Pool) -> MakeOrch:
    counter = iter(range(1_000_000))

    def make(org_id: str = "org-a", linear_user_id: str | None = None, name: str | None = None) -> Orch:
        n = next(counter)
        user = linear_user_id or f"user-{n}"
        reg = register(pool, org_id=org_id, linear_user_id=user, name=name or f"machine-{n}")
        return Orch(reg.id, reg.token, org_id, user)

    return make


@pytest.fixture
def api_overrides() -> dict[str, object]:
    """Override in a test module (or via parametrize) to run the server with other settings."""
    return {}


@pytest.fixture
def api(db_url: str, api_overrides: dict[str, object], httpserver: HTTPServer) -> Iterator[Api]:
    import httpx

    from tests.helpers.api import Served

    env = bouncer.app_env(db_url)
    pooled = {"DEVPILOT_TRANSACTION_POOLER": True} if bouncer.POOLER else {}
    # Posts to Linear go to the local stand-in (tests/helpers/linear.py), never out.
    linear_api: dict[str, object] = {"LINEAR_API_URL": httpserver.url_for("/graphql")}
    settings = api_settings(**pooled, **{**linear_api, **api_overrides})
    p = open_pool(env["DATABASE_URL"], settings, min_size=2, max_size=30)
    served = Served(db_url, settings, p)
    with httpx.Client(base_url=served.url, timeout=30) as client:
        yield Api(served.url, settings, p, client, served)
    served.close()
    p.close()


@pytest.fixture
def linear(api: Api, httpserver: HTTPServer) -> Linear:
    """A stand-in Linear that checks every call against Linear's schema, and org-a connected to it."""
    stand_in = Linear(httpserver)
    r = api.http.post(
        "/linear-credentials", json={"orgId": "org-a", "accessToken": "lin-test"}, headers=api.admin()
    )
    assert r.status_code == 200, r.text
    return stand_in


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git checkout for the orchestrator to run in."""
    return checkout(tmp_path / "checkout")


@pytest.fixture
def across_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if each webhook reached another instance of the service: this process's arrival order
    (`shared.plumbing.in_order`) does not hold them back, only the database's turns order them."""
    from shared.delivery import intake

    monkeypatch.setattr(intake, "_order_key", lambda hook, plan: None)
