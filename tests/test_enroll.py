"""People connect their own machines by signing in with Linear (/enroll, /me, `devpilot-orchestrator
login`), against the stand-in Linear (tests/helpers/linear.py: actor=user sign-in with PKCE, `viewer`,
token revocation, the users directory, all checked against Linear's schema)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer

from shared.signin import s256
from tests.helpers.api import Api
from tests.helpers.browser import Browser, query
from tests.helpers.linear import LinearOAuth, person
from tests.test_oauth import install, linear_env

ROOT = Path(__file__).parent.parent
ACME = LinearOAuth.ORG  # installs the app (OAuth) in the tests that need it
BETA = {"id": "org-beta", "name": "Beta Corp", "urlKey": "beta"}  # installs with a static token
GAMMA = {"id": "org-gamma", "name": "Gamma Works", "urlKey": "gamma"}  # never installs
PEOPLE = [
    person("u-alice", "Alice Example", ACME),
    person("u-bob", "Bob Builder", ACME),
    person("u-gina", "Gina Guest", ACME, guest=True),
    person("u-olga", "Olga Gone", ACME, active=False),
    person("u-bot", "Some Bot", ACME, app=True),
    person("u-carol", "Carol Beta", BETA),
    person("u-dan", "Dan Gamma", GAMMA),
]
VERIFIER = "v" * 43 + "-long-enough-verifier"


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return {
        **linear_env(httpserver),
        "LINEAR_OAUTH_AUTHORIZE_URL": httpserver.url_for("/oauth/authorize"),
        "LINEAR_OAUTH_REVOKE_URL": httpserver.url_for("/oauth/revoke"),
    }


@pytest.fixture
def linear(api: Api, httpserver: HTTPServer) -> LinearOAuth:
    """Acme has installed the app; Beta has a static token; Gamma nothing. The browser is signed in
    to Linear as Alice. The service's public URL is the test server's."""
    api.settings.__dict__["public_url"] = api.url
    stand_in = LinearOAuth(httpserver)
    stand_in.people = {p["id"]: p for p in PEOPLE}
    stand_in.signed_in = "u-alice"
    assert install(api).status_code == 200
    r = api.http.post(
        "/linear-credentials", json={"orgId": BETA["id"], "accessToken": "lin_api_beta"}, headers=api.admin()
    )
    assert r.status_code == 200
    return stand_in


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


def ask(api: Api, name: str = "laptop", port: int | None = 40123, verifier: str = VERIFIER) -> dict[str, Any]:
    """What `login` asks first (as the machine): an enrollment, loopback with `port`, else code mode."""
    body: dict[str, Any] = {"name": name, "codeChallenge": s256(verifier), "codeChallengeMethod": "S256"}
    body |= {"loopbackPort": port} if port is not None else {"mode": "code"}
    r = api.http.post("/enroll/sessions", json=body)
    assert r.status_code == 201, r.text
    answer: dict[str, Any] = r.json()
    return answer


def sign_in(browser: Browser, started: dict[str, Any], port: int = 40123) -> dict[str, Any]:
    """The browser opens the start link, signs in with Linear, and comes back: the loopback
    redirect's query (not followed: nothing listens in these tests)."""
    resp = browser.go(started["startUrl"], stop_at=f"http://127.0.0.1:{port}/")
    assert resp.status_code == 302, resp.text
    location = resp.headers["Location"]
    assert location.startswith(f"http://127.0.0.1:{port}/callback?"), location
    return query(location)


def redeem(api: Api, enroll_id: str, code: str | None = None, verifier: str = VERIFIER) -> httpx.Response:
    body = {"enrollId": enroll_id, "codeVerifier": verifier} | ({"code": code} if code else {})
    return api.http.post("/enroll/token", json=body)


def login(api: Api, linear: LinearOAuth, who: str = "u-alice", name: str = "laptop") -> dict[str, Any]:
    """A whole loopback login at the HTTP level (the machine's part played by the test)."""
    linear.signed_in = who
    b = Browser()
    try:
        started = ask(api, name)
        back = sign_in(b, started)
        r = redeem(api, started["enrollId"], back["code"])
    finally:
        b.close()
    assert r.status_code == 201, r.text
    answer: dict[str, Any] = r.json()
    return answer


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "BROWSER": "true", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_lines(proc: subprocess.Popen[str], n: int) -> list[str]:
    assert proc.stdout is not None
    return [proc.stdout.readline().rstrip("\n") for _ in range(n)]


# --- the loopback login, end to end with the real CLI --------------------------------------------
def test_login_with_a_browser_end_to_end(
    api: Api, linear: LinearOAuth, browser: Browser, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    proc = cli("login", "--url", api.url, "--name", "laptop-7", "--state-dir", str(state))
    try:
        [line] = first_lines(proc, 1)
        assert line.startswith("Open this link to sign in: "), line
        link = line.removeprefix("Open this link to sign in: ")
        page = browser.go(link)  # the service, Linear, the callback, the CLI's loopback page
        assert page.status_code == 200, [(r.status_code, str(r.url), r.text[:300]) for r in browser.history]
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "Registered laptop-7 for Alice Example in Acme Robotics"
    assert page.status_code == 200 and "Registered laptop-7" in page.text
    # the browser went: service -> Linear (actor=user, read, PKCE S256) -> callback -> loopback
    hops = [str(r.url) for r in browser.history]
    assert hops[0] == link and hops[-1].startswith("http://127.0.0.1:") and "/callback?code=" in hops[-1]
    [asked] = linear.authorized
    assert asked["actor"] == "user" and asked["scope"] == "read" and asked["code_challenge_method"] == "S256"
    assert asked["redirect_uri"] == f"{api.url}/enroll/callback" and asked["client_id"] == "client-id"
    # Linear's token for Alice was used for `viewer` once, then revoked at once
    assert len(linear.viewers) == 1 and linear.revoked == linear.viewers and linear.user_tokens == {}
    assert not linear.invalid
    # the machine's token: in the state directory only (0600 in 0700), and it works
    saved = state / "login.json"
    assert saved.stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    import json

    token = json.loads(saved.read_text())["token"]
    assert api.post_as(token, "/claim", {}).status_code == 200
    assert token not in out + err and all(token not in h for h in hops)
    assert all(token not in r.text for r in browser.history)
    # the app's own connection is untouched by a person's sign-in
    listed = api.http.get("/linear-credentials", headers=api.admin()).json()["orgs"]
    assert {o["orgId"]: o["connected"] for o in listed} == {ACME["id"]: True, BETA["id"]: True}
    # later runs find it: whoami and machines, with no token or URL given
    who = cli("whoami", "--state-dir", str(state), env={"DEVPILOT_ORCHESTRATOR_TOKEN": ""})
    out, err = who.communicate(timeout=30)
    assert who.returncode == 0, err
    assert out.splitlines() == [
        f"workspace: Acme Robotics ({ACME['id']})",
        "person: Alice Example (u-alice)",
        f"machine: laptop-7 ({json.loads(saved.read_text())['orchestratorId']})",
    ]
