"""People connect their own machines by signing in with Linear (/enroll, /me, `devpilot-orchestrator
login`), against the stand-in Linear (tests/helpers/linear.py: actor=user sign-in with PKCE, `viewer`,
token revocation, the users directory, all checked against Linear's schema)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer

from shared.fleet.signin import s256
from tests.helpers.api import Api, app_revoked_event, issue_event
from tests.helpers.browser import Browser, form_fields, query
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
        assert proc.stderr is not None
        loopback = proc.stderr.readline().split()[-2]  # "Waiting for the browser to come back to URL ..."
        assert loopback.startswith("http://127.0.0.1:") and loopback.endswith("/callback")
        # a redirect to the loopback that is not this sign-in's (another state) is turned away, and
        # the CLI waits on for the real one
        forged = httpx.get(loopback, params={"code": "stolen", "state": "not-this-one"})
        assert forged.status_code == 400 and proc.poll() is None
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
        "told the service: nothing yet (the orchestrator tells it its --repo and --label as it starts)",
    ]


@pytest.mark.parametrize(
    ("who", "refused_with", "said"),
    [
        ("u-dan", "", "the Linear workspace Gamma Works has not installed devpilot: ask your admin"),
        ("u-gina", "", "guests of Acme Robotics cannot connect machines"),
        ("u-alice", '<script>alert("x")</script>', 'Linear did not sign you in: <script>alert("x")</script>'),
    ],
)
def test_a_refused_sign_in_ends_login_at_once_with_the_reason(
    api: Api, linear: LinearOAuth, browser: Browser, tmp_path: Path, who: str, refused_with: str, said: str
) -> None:
    """The workspace has not installed the app, a guest, or Linear refused: the browser shows why
    and the terminal prints it and exits 1 at once, instead of waiting out the 10 minutes."""
    linear.signed_in, linear.refuse_with = who, refused_with
    proc = cli("login", "--url", api.url, "--name", "laptop", "--state-dir", str(tmp_path / "state"))
    try:
        [line] = first_lines(proc, 1)
        page = browser.go(line.removeprefix("Open this link to sign in: "))  # on to the CLI's loopback
        out, err = proc.communicate(timeout=2)  # done as the browser's page is: nothing left to wait for
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "Registered" not in out
    assert err.strip().splitlines()[-1].startswith(f"devpilot-orchestrator login: {said}")
    assert page.status_code == 403 and str(page.url).startswith("http://127.0.0.1:")
    assert "<script>" not in page.text and escape(said) in page.text
    assert not (tmp_path / "state" / "login.json").exists()


def test_a_refused_sign_in_ends_a_login_without_a_browser_with_the_reason(
    api: Api, linear: LinearOAuth, browser: Browser, tmp_path: Path
) -> None:
    linear.signed_in = "u-dan"  # Gamma has not installed the app
    proc = cli("login", "--url", api.url, "--name", "ssh-box", "--no-browser", "--state-dir", str(tmp_path))
    try:
        _, code_line = first_lines(proc, 2)
        page = browser.go(f"{api.url}/enroll", method="POST", data={"code": code_line.split()[-1]})
        out, err = proc.communicate(timeout=10)  # its next poll (every 2 s) hears it
    finally:
        if proc.poll() is None:
            proc.kill()
    assert page.status_code == 403 and f"{api.url}/oauth/install" in page.text
    assert proc.returncode == 1 and "Registered" not in out
    assert err.strip().splitlines()[-1] == (
        "devpilot-orchestrator login: the Linear workspace Gamma Works has not installed devpilot: "
        f"ask your admin to install it at {api.url}/oauth/install"
    )


def is_private(resp: httpx.Response) -> bool:
    """What every answer of /enroll and /me carries."""
    csp = resp.headers.get("content-security-policy", "")
    return (
        resp.headers.get("cache-control") == "no-store"
        and resp.headers.get("referrer-policy") == "no-referrer"
        and "frame-ancestors 'none'" in csp
        and resp.headers.get("x-frame-options") == "DENY"
    )


def ours(api: Api, browser: Browser) -> list[httpx.Response]:
    """The browser's answers from /enroll and /me."""
    return [r for r in browser.history if str(r.url).startswith((f"{api.url}/enroll", f"{api.url}/me"))]


def enrollments(api: Api) -> list[dict[str, Any]]:
    with api.pool.connection() as conn:
        return [dict(r) for r in conn.execute("SELECT * FROM enrollments ORDER BY created_at")]


def sql(api: Api, statement: str, *params: object) -> None:
    with api.pool.connection() as conn:
        conn.execute(statement, params)


# --- the headless login: a code typed on a page ----------------------------------------------------
def test_login_without_a_browser_by_a_code_and_a_confirm_page(
    api: Api, linear: LinearOAuth, browser: Browser, tmp_path: Path
) -> None:
    proc = cli("login", "--url", api.url, "--name", "ssh-box", "--no-browser", "--state-dir", str(tmp_path))
    try:
        page_line, code_line = first_lines(proc, 2)
        assert page_line == f"Open this page on any device: {api.url}/enroll"
        code = code_line.removeprefix("and enter the code: ")
        assert len(code) == 9 and code[4] == "-" and code.replace("-", "").isalpha()
        form = browser.go(f"{api.url}/enroll")
        assert form.status_code == 200 and 'name="code"' in form.text
        # typed as a person may: lower case, without the dash
        confirm = browser.go(f"{api.url}/enroll", method="POST", data={"code": code.replace("-", "").lower()})
        assert confirm.status_code == 200, confirm.text
        for shown in ("ssh-box", "Alice Example", "Acme Robotics", "127.0.0.1", "UTC", "Register", "Deny"):
            assert shown in confirm.text, shown
        done = browser.go(
            f"{api.url}/enroll/confirm",
            method="POST",
            data={**form_fields(confirm.text), "decision": "register"},
        )
        assert done.status_code == 200 and "registered" in done.text
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip().splitlines()[-1] == "Registered ssh-box for Alice Example in Acme Robotics"
    assert code.replace("-", "") not in "".join(
        line for line in out.splitlines() if "://" in line
    )  # never pre-filled
    assert all(is_private(r) for r in ours(api, browser))
    assert (tmp_path / "login.json").stat().st_mode & 0o777 == 0o600


def test_deny_on_the_confirm_page_refuses_the_machine(
    api: Api, linear: LinearOAuth, browser: Browser
) -> None:
    started = ask(api, "stranger", port=None)
    assert redeem(api, started["enrollId"]).json()["error"] == "authorization_pending"
    confirm = browser.go(f"{api.url}/enroll", method="POST", data={"code": started["userCode"]})
    assert redeem(api, started["enrollId"]).json()["error"] == "authorization_pending"  # not yet confirmed
    fields = form_fields(confirm.text)
    forged = browser.go(
        f"{api.url}/enroll/confirm", method="POST", data={**fields, "csrf": "x", "decision": "register"}
    )
    assert forged.status_code == 400
    other = Browser()  # the right form, from a browser that did not sign in
    try:
        elsewhere = other.go(
            f"{api.url}/enroll/confirm", method="POST", data={**fields, "decision": "register"}
        )
    finally:
        other.close()
    assert elsewhere.status_code == 400
    denied = browser.go(f"{api.url}/enroll/confirm", method="POST", data={**fields, "decision": "deny"})
    assert denied.status_code == 200 and "not registered" in denied.text
    r = redeem(api, started["enrollId"])
    assert r.status_code == 400 and r.json()["error"] == "access_denied"
    again = browser.go(f"{api.url}/enroll/confirm", method="POST", data={**fields, "decision": "register"})
    assert again.status_code == 400 and redeem(api, started["enrollId"]).json()["error"] == "access_denied"
    assert api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"] == []


def test_login_ends_with_the_reason_when_the_person_denies(
    api: Api, linear: LinearOAuth, browser: Browser
) -> None:
    proc = cli(
        "login",
        "--url",
        api.url,
        "--name",
        "not-mine",
        "--no-browser",
        "--state-dir",
        str(Path("/nonexistent")),
    )
    try:
        _, code_line = first_lines(proc, 2)
        confirm = browser.go(f"{api.url}/enroll", method="POST", data={"code": code_line.split()[-1]})
        browser.go(
            f"{api.url}/enroll/confirm", method="POST", data={**form_fields(confirm.text), "decision": "deny"}
        )
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "Registered" not in out
    assert (
        err.strip().splitlines()[-1]
        == "devpilot-orchestrator login: the request was denied on the confirm page"
    )


# --- logging in again, logging out ------------------------------------------------------------------
def test_logging_in_again_replaces_the_token_and_keeps_the_queued_work(api: Api, linear: LinearOAuth) -> None:
    first = login(api, linear, "u-alice", "laptop")
    assert first["replaced"] is False and first["workspaceName"] == "Acme Robotics"
    queued = api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-replace"))
    assert queued.json()["orchestratorId"] == first["orchestratorId"]
    second = login(api, linear, "u-alice", "laptop")
    assert second["orchestratorId"] == first["orchestratorId"] and second["replaced"] is True
    assert api.post_as(first["token"], "/claim", {}).status_code == 401  # the old token: dead at once
    [message] = api.post_as(second["token"], "/claim", {}).json()["messages"]
    assert message["issue"]["id"] == "iss-replace"
    other = login(api, linear, "u-alice", "desktop")  # another name: another machine
    assert other["orchestratorId"] != first["orchestratorId"] and other["replaced"] is False
    bob = login(api, linear, "u-bob", "laptop")  # the same name, another person: their own machine
    assert bob["orchestratorId"] != first["orchestratorId"] and bob["personName"] == "Bob Builder"


def test_a_long_poll_of_the_replaced_token_ends_and_takes_nothing(api: Api, linear: LinearOAuth) -> None:
    """A long-poll authenticated with the old token, waiting when its owner logs in again: woken by
    new work, it answers 401 having claimed nothing; the new token takes the work."""
    import threading

    first = login(api, linear, "u-alice", "laptop")
    answered: dict[str, Any] = {}

    def long_poll() -> None:
        answered["r"] = api.post_as(first["token"], "/claim", {"waitSeconds": 15})

    waiter = threading.Thread(target=long_poll)
    waiter.start()
    time.sleep(0.5)  # (waiting now)
    second = login(api, linear, "u-alice", "laptop")
    api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-old-poll"))
    waiter.join(timeout=20)
    assert answered["r"].status_code == 401 and answered["r"].json()["error"] == "unauthorized"
    [message] = api.post_as(second["token"], "/claim", {}).json()["messages"]
    assert message["issue"]["id"] == "iss-old-poll" and message["attempt"] == 1


def test_logout_revokes_this_machine_and_its_work_moves(
    api: Api, linear: LinearOAuth, tmp_path: Path
) -> None:
    from orchestrator.state import store

    laptop = login(api, linear, "u-alice", "laptop")
    desktop = login(api, linear, "u-alice", "desktop")
    store(tmp_path, {"url": api.url, "token": laptop["token"], "orchestratorId": laptop["orchestratorId"]})
    assert api.post_as(laptop["token"], "/claim", {}).status_code == 200  # seen last: it takes the work
    queued = api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-logout"))
    assert queued.json()["orchestratorId"] == laptop["orchestratorId"]
    listed = cli("machines", "--state-dir", str(tmp_path), env={"DEVPILOT_ORCHESTRATOR_TOKEN": ""})
    out, err = listed.communicate(timeout=30)
    assert listed.returncode == 0, err
    [mine] = [line for line in out.splitlines() if line.startswith("* ")]
    assert "laptop" in mine and "polling" in mine and "1 (ENG-42)" in mine
    assert any("desktop" in line and "never" in line for line in out.splitlines())
    proc = cli("logout", "--state-dir", str(tmp_path), env={"DEVPILOT_ORCHESTRATOR_TOKEN": ""})
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.strip() == "Logged out: laptop is revoked (1 queued moved to your other machine, 0 cancelled)"
    assert not (tmp_path / "login.json").exists()
    assert api.post_as(laptop["token"], "/claim", {}).status_code == 401
    [moved] = api.post_as(desktop["token"], "/claim", {}).json()["messages"]
    assert moved["issue"]["id"] == "iss-logout"
    again = cli("whoami", "--state-dir", str(tmp_path), env={"DEVPILOT_ORCHESTRATOR_TOKEN": ""})
    _, err = again.communicate(timeout=30)
    assert again.returncode == 1 and "not logged in" in err
    # a token, but no URL (no login here to take it from): what is missing, and how to give it
    given = cli("whoami", "--state-dir", str(tmp_path), env={"DEVPILOT_ORCHESTRATOR_TOKEN": desktop["token"]})
    _, err = given.communicate(timeout=30)
    assert given.returncode == 1 and "not logged in" not in err
    assert err.strip() == (
        "devpilot-orchestrator whoami: no service URL: give --url BASE (the service the token is for); "
        "`devpilot-orchestrator login --url BASE` keeps both"
    )
    told = cli(
        "whoami",
        "--url",
        api.url,
        "--state-dir",
        str(tmp_path),
        env={"DEVPILOT_ORCHESTRATOR_TOKEN": desktop["token"]},
    )
    out, err = told.communicate(timeout=30)
    assert told.returncode == 0 and "machine: desktop" in out, err


def test_whoami_and_machines_on_an_idle_machine_do_not_change_routing(
    api: Api, linear: LinearOAuth, tmp_path: Path
) -> None:
    """Only a machine asking for work is seen: a person running `whoami` or `machines` on a machine
    whose orchestrator is not running does not make it the one the next issue goes to."""
    from orchestrator.state import store

    laptop = login(api, linear, "u-alice", "laptop")
    desktop = login(api, linear, "u-alice", "desktop")
    store(tmp_path, {"url": api.url, "token": desktop["token"], "orchestratorId": desktop["orchestratorId"]})
    assert api.post_as(laptop["token"], "/claim", {}).status_code == 200  # the laptop's orchestrator polls
    for command in ("whoami", "machines", "whoami"):  # the desktop's person asks about it
        proc = cli(command, "--state-dir", str(tmp_path), env={"DEVPILOT_ORCHESTRATOR_TOKEN": ""})
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    listed = cli("machines", "--state-dir", str(tmp_path), env={"DEVPILOT_ORCHESTRATOR_TOKEN": ""})
    out, _ = listed.communicate(timeout=30)
    [desk] = [line for line in out.splitlines() if line.startswith("* ")]
    assert "desktop" in desk and "never" in desk  # still never seen
    queued = api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-idle"))
    assert queued.json()["orchestratorId"] == laptop["orchestratorId"]
    # its orchestrator polling is what makes it seen (and the one the next issue goes to)
    assert api.post_as(desktop["token"], "/claim", {}).status_code == 200
    queued = api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-polled"))
    assert queued.json()["orchestratorId"] == desktop["orchestratorId"]


# --- /me ---------------------------------------------------------------------------------------------
def me_sign_in(api: Api, linear: LinearOAuth, browser: Browser, who: str) -> httpx.Response:
    linear.signed_in = who
    page = browser.go(f"{api.url}/me/signin")
    assert page.status_code == 200, page.text
    return page


def test_me_shows_and_revokes_ones_own_machines_only(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    laptop = login(api, linear, "u-alice", "laptop")
    desktop = login(api, linear, "u-alice", "desktop")
    bob = login(api, linear, "u-bob", "bob-box")
    carol = login(api, linear, "u-carol", "carol-box")  # another workspace (Beta)
    assert carol["workspaceName"] == "Beta Corp"
    api.post_as(laptop["token"], "/claim", {})
    api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-me"))
    anonymous = browser.go(f"{api.url}/me")
    assert anonymous.status_code == 401 and 'href="/me/signin"' in anonymous.text
    page = me_sign_in(api, linear, browser, "u-alice")
    assert str(page.url) == f"{api.url}/me" and "Alice Example" in page.text and "Acme Robotics" in page.text
    assert f'data-orchestrator="{laptop["orchestratorId"]}"' in page.text and "1 (ENG-42)" in page.text
    assert f'data-orchestrator="{desktop["orchestratorId"]}"' in page.text
    assert "bob-box" not in page.text and "carol-box" not in page.text
    assert 'class="transport">polling' in page.text
    csrf = form_fields(page.text)["csrf"]
    missing = "6f1c2b1e-8a4e-4a53-9d55-2f1f3e4c5d6a"
    for other in (bob["orchestratorId"], carol["orchestratorId"], missing):  # another's: as none at all
        r = browser.go(f"{api.url}/me/orchestrators/{other}/revoke", method="POST", data={"csrf": csrf})
        assert r.status_code == 404 and r.json()["error"] == "not_found", other
    target = f"{api.url}/me/orchestrators/{desktop['orchestratorId']}/revoke"
    assert browser.go(target, method="POST", data={}).status_code == 403  # no CSRF token
    assert browser.go(target, method="POST", data={"csrf": "forged"}).status_code == 403
    assert api.http.post(target).status_code == 401  # nobody signed in
    after = browser.go(target, method="POST", data={"csrf": csrf})
    assert after.status_code == 200 and str(after.url) == f"{api.url}/me"
    assert desktop["orchestratorId"] not in after.text and laptop["orchestratorId"] in after.text
    assert api.post_as(desktop["token"], "/claim", {}).status_code == 401
    assert api.post_as(bob["token"], "/claim", {}).status_code == 200  # untouched
    # a machine's own token: its person's machines, never another's
    seen = api.http.get("/me", headers={"Authorization": f"Bearer {carol['token']}"}).json()
    assert seen["workspaceName"] == "Beta Corp" and [m["name"] for m in seen["orchestrators"]] == [
        "carol-box"
    ]
    stolen = api.http.post(
        f"/me/orchestrators/{laptop['orchestratorId']}/revoke",
        headers={"Authorization": f"Bearer {carol['token']}"},
    )
    assert stolen.status_code == 404
    assert api.http.get("/me", headers={"Authorization": "Bearer dpo_wrong"}).status_code == 401
    # the /me session is not the operators' dashboard session
    assert browser.go(f"{api.url}/dashboard").status_code == 401
    # signing out ends the session on the server: the same cookie opens nothing afterwards
    cookie = browser.cookie("__Host-devpilot-me")
    browser.go(f"{api.url}/me/logout", method="POST", data={"csrf": csrf})
    assert (
        cookie and api.http.get("/me", headers={"Cookie": f"__Host-devpilot-me={cookie}"}).status_code == 401
    )
    assert all(is_private(r) for r in ours(api, browser))


def test_me_in_another_workspace_sees_only_its_own(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    alice = login(api, linear, "u-alice", "laptop")
    login(api, linear, "u-carol", "carol-box")
    page = me_sign_in(api, linear, browser, "u-carol")
    assert "Beta Corp" in page.text and "carol-box" in page.text and "laptop" not in page.text
    r = browser.go(
        f"{api.url}/me/orchestrators/{alice['orchestratorId']}/revoke",
        method="POST",
        data={"csrf": form_fields(page.text)["csrf"]},
    )
    assert r.status_code == 404 and api.post_as(alice["token"], "/claim", {}).status_code == 200


def test_after_the_app_is_uninstalled_what_was_granted_stays_and_new_sign_ins_are_refused(
    api: Api, linear: LinearOAuth, browser: Browser
) -> None:
    """Linear's `OAuthApp revoked`: a new sign-in (a login, a /me sign-in) is refused; the machine
    connected by login keeps its token and takes what was queued for it, and a /me sign-in made
    before still shows and revokes its machines (docs/connecting-machines.md)."""
    laptop = login(api, linear, "u-alice", "laptop")
    page = me_sign_in(api, linear, browser, "u-alice")
    queued = api.webhook(issue_event(org=ACME["id"], assignee="u-alice", issue_id="iss-un")).json()
    assert api.webhook(app_revoked_event(ACME["id"])).json()["status"] == "ignored"
    started = ask(api, "desktop")
    refused = browser.go(started["startUrl"], stop_at="http://127.0.0.1:40123/")
    told = query(refused.headers["Location"])  # on to the waiting login, with why
    assert refused.status_code == 302 and told["error"] == "access_denied"
    assert "has not installed devpilot" in told["error_description"]
    me_again = Browser().go(f"{api.url}/me/signin")  # a /me sign-in too
    assert me_again.status_code == 403 and "workspace_not_connected" in me_again.text
    claimed = api.post_as(laptop["token"], "/claim", {}).json()["messages"]
    assert [m["queueId"] for m in claimed] == [queued["queueId"]]
    still = browser.go(f"{api.url}/me")
    assert still.status_code == 200 and f'data-orchestrator="{laptop["orchestratorId"]}"' in still.text
    target = f"{api.url}/me/orchestrators/{laptop['orchestratorId']}/revoke"
    assert browser.go(target, method="POST", data={"csrf": form_fields(page.text)["csrf"]}).status_code == 200
    assert api.post_as(laptop["token"], "/claim", {}).status_code == 401


# --- the operators' route checks the user with Linear -------------------------------------------
def test_registering_by_hand_asks_linear_whether_the_user_is_in_the_workspace(
    api: Api, linear: LinearOAuth
) -> None:
    def register(org: str, user: str) -> httpx.Response:
        body = {"orgId": org, "linearUserId": user, "name": "by-hand"}
        return api.http.post("/orchestrators", json=body, headers=api.admin())

    known = register(ACME["id"], "u-alice")
    assert known.status_code == 201 and known.json()["verified"] is True
    for typo in ("u-alcie", "u-carol"):  # nobody, and someone of another workspace
        r = register(ACME["id"], typo)
        assert r.status_code == 400 and r.json()["error"] == "unknown_user", typo
    assert len(api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]) == 1
    unconnected = register(GAMMA["id"], "u-dan")  # no connection: Linear cannot be asked
    assert unconnected.status_code == 201 and unconnected.json()["verified"] is False
    linear.expire_all()  # Linear refuses the workspace's token (401): not asked again, not refreshed
    refused = register(ACME["id"], "u-nobody")
    assert refused.status_code == 201 and refused.json()["verified"] is False and linear.refreshes == 0
    api.settings.__dict__["linear_api_url"] = "http://127.0.0.1:9/graphql"  # Linear unreachable
    away = register(ACME["id"], "u-nobody")
    assert away.status_code == 201 and away.json()["verified"] is False
    assert not linear.invalid  # each lookup valid by Linear's schema
    assert [q["variables"]["id"] for q in linear.lookups] == ["u-alice", "u-alcie", "u-carol"]


# --- what must be refused ---------------------------------------------------------------------------
def test_a_stolen_or_replayed_code_is_useless(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    started = ask(api)
    back = sign_in(browser, started)
    assert back["state"] == started["enrollId"]
    thief = redeem(api, started["enrollId"], back["code"], verifier="t" * 43)  # the code, not the verifier
    assert thief.status_code == 400 and thief.json()["error"] == "invalid_grant"
    owner = redeem(api, started["enrollId"], back["code"])  # spent: the owner is refused too
    assert owner.status_code == 400 and owner.json()["error"] == "invalid_grant"

    started = ask(api)
    back = sign_in(Browser(), started)
    assert redeem(api, started["enrollId"], "wrong-code").json()["error"] == "invalid_grant"
    assert redeem(api, started["enrollId"], back["code"]).json()["error"] == "invalid_grant"

    started = ask(api)
    back = sign_in(Browser(), started)
    assert redeem(api, started["enrollId"], back["code"]).status_code == 201
    replay = redeem(api, started["enrollId"], back["code"])  # single use
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"

    started = ask(api)
    back = sign_in(Browser(), started)
    sql(
        api,
        "UPDATE enrollments SET grant_expires_at = now() - interval '1 second' WHERE id = %s",
        started["enrollId"],
    )
    late = redeem(api, started["enrollId"], back["code"])  # past its 60 s
    assert late.status_code == 400 and late.json()["error"] == "invalid_grant"
    assert len(api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]) == 1


def test_a_forged_or_replayed_state_is_refused(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    started = ask(api)
    to_linear = browser.go(started["startUrl"], stop_at=api.url)  # Linear's redirect back, not followed
    callback = to_linear.headers["Location"]
    q = query(callback)
    forged = browser.go(f"{api.url}/enroll/callback?code={q['code']}&state=forged-state")
    assert forged.status_code == 400 and "not ours" in forged.text
    first = browser.go(callback, stop_at="http://127.0.0.1:40123/")
    assert first.status_code == 302  # the real one still works (a forged state used nothing up)
    replayed = browser.go(callback, stop_at="http://127.0.0.1:40123/")
    assert replayed.status_code == 400 and "already used" in replayed.text
    assert len(linear.viewers) == 1  # Linear was asked once: a refused state reaches nobody


def test_a_callback_in_another_browser_is_refused(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    started = ask(api)
    callback = browser.go(started["startUrl"], stop_at=api.url).headers["Location"]
    for other in (Browser(), Browser()):
        if not other.cookies():
            other.go(ask(api)["startUrl"], stop_at=api.url)  # the second has a sign-in cookie of its own
        r = other.go(callback, stop_at="http://127.0.0.1:40123/")
        assert r.status_code == 400 and "another browser" in r.text
        other.close()
    assert len(linear.viewers) == 0
    finished = browser.go(callback, stop_at="http://127.0.0.1:40123/")  # where it started, it goes on
    assert finished.status_code == 302


@pytest.mark.parametrize(
    ("who", "status", "said"),
    [
        ("u-gina", 403, "not_allowed"),  # a guest
        ("u-olga", 403, "not_allowed"),  # deactivated
        ("u-bot", 403, "not_allowed"),  # an app user
        ("u-dan", 403, "workspace_not_connected"),  # a workspace that never installed the app
    ],
)
def test_who_may_not_connect_a_machine(
    api: Api, linear: LinearOAuth, browser: Browser, who: str, status: int, said: str
) -> None:
    """Refused: a loopback login is sent the reason (RFC 6749 §4.1.2.1: `error` and
    `error_description` to its redirect URI, with its state); a code-mode login sees the page, and
    its machine the reason at its next poll. Either way the enrollment is over."""
    loopback, code = ask(api), ask(api, port=None)
    linear.signed_in = who
    refused = browser.go(loopback["startUrl"], stop_at="http://127.0.0.1:40123/")
    assert refused.status_code == 302, refused.text
    told = query(refused.headers["Location"])
    assert refused.headers["Location"].startswith("http://127.0.0.1:40123/callback?")
    assert told["error"] == "access_denied" and told["state"] == loopback["enrollId"] and "code" not in told
    page = browser.go(f"{api.url}/enroll", method="POST", data={"code": code["userCode"]})
    assert page.status_code == status and said in page.text
    if said == "workspace_not_connected":
        assert f"{api.url}/oauth/install" in told["error_description"]
        assert f"{api.url}/oauth/install" in page.text
    for started, given in ((loopback, "any-code"), (code, None)):
        r = redeem(api, started["enrollId"], given)
        assert r.status_code == 400 and r.json()["error"] == "access_denied"
        assert r.json()["detail"] == told["error_description"]  # why, as the loopback heard it
    assert linear.revoked == linear.viewers and len(linear.viewers) == 2  # asked, then revoked at once
    assert [e["status"] for e in enrollments(api)] == ["denied", "denied"]
    assert browser.go(loopback["startUrl"]).status_code == 400  # over: a new login starts again
    assert api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"] == []


def test_five_wrong_codes_then_429(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    started = ask(api, port=None)
    for wrong in ("BCDF-GHJK", "nonsense", "", "BCDFGHJKL", "ZZZZ-ZZZZ"):
        r = browser.go(f"{api.url}/enroll", method="POST", data={"code": wrong})
        assert r.status_code == 400, wrong
    blocked = browser.go(f"{api.url}/enroll", method="POST", data={"code": started["userCode"]})
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) > 0
    assert linear.authorized == []  # the right code, after five wrong ones, went nowhere


def test_an_expired_enrollment_is_refused(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    loopback, code = ask(api), ask(api, port=None)
    sql(api, "UPDATE enrollments SET expires_at = now() - interval '1 second'")
    start = browser.go(loopback["startUrl"])
    assert start.status_code == 400 and "older than 10 minutes" in start.text
    typed = browser.go(f"{api.url}/enroll", method="POST", data={"code": code["userCode"]})
    assert typed.status_code == 400
    for e in (loopback, code):
        r = redeem(api, e["enrollId"], "any-code" if e is loopback else None)
        assert r.status_code == 400 and r.json()["error"] == "expired_token"
    assert linear.authorized == []


def test_a_bad_port_or_a_redirect_of_the_clients_is_refused(api: Api, linear: LinearOAuth) -> None:
    good = {"name": "laptop", "codeChallenge": s256(VERIFIER), "codeChallengeMethod": "S256"}
    for bad in (
        {"loopbackPort": 0},
        {"loopbackPort": 1023},
        {"loopbackPort": 65536},
        {"loopbackPort": "8080"},
        {"loopbackPort": 8080.5},
        {"loopbackPort": True},
        {},  # loopback without a port
        {"mode": "code", "loopbackPort": 8080},
        {"loopbackPort": 8080, "redirectUri": "https://evil.example/steal"},
        {"loopbackPort": 8080, "redirect_uri": "https://evil.example/steal"},
        {"loopbackPort": 8080, "codeChallengeMethod": "plain"},
        {"loopbackPort": 8080, "codeChallenge": "short"},
    ):
        r = api.http.post("/enroll/sessions", json={**good, **bad})
        assert r.status_code == 400 and r.json()["error"] == "bad_request", bad
        assert is_private(r)
    assert enrollments(api) == []


def test_asking_to_enroll_is_rate_limited_per_client(api: Api, linear: LinearOAuth) -> None:
    from shared.fleet.enroll import ENROLL_LIMIT

    for _ in range(ENROLL_LIMIT):
        ask(api)
    r = api.http.post(
        "/enroll/sessions",
        json={"name": "x", "codeChallenge": s256(VERIFIER), "codeChallengeMethod": "S256", "mode": "code"},
    )
    assert r.status_code == 429 and r.json()["error"] == "too_many_attempts" and "retry-after" in r.headers
    assert len(enrollments(api)) == ENROLL_LIMIT


def test_linears_error_is_shown_escaped(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    linear.refuse_with = '<script>alert("x")</script>'
    started = ask(api, port=None)
    r = browser.go(f"{api.url}/enroll", method="POST", data={"code": started["userCode"]})
    assert r.status_code == 400 and "<script>" not in r.text and "&lt;script&gt;" in r.text
    direct = browser.go(f"{api.url}/enroll/callback?error=%3Cb%3Ex&error_description=%3Cimg%20src=x%3E")
    assert direct.status_code == 400 and "<img" not in direct.text and "&lt;img src=x&gt;" in direct.text
    assert all(is_private(x) for x in ours(api, browser))


def test_every_answer_of_enroll_and_me_is_private(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    started, code = ask(api), ask(api, port=None)
    answers = [
        api.http.post("/enroll/sessions", json={"name": "x"}),
        redeem(api, started["enrollId"]),
        redeem(api, "not-an-id"),
        api.http.get("/enroll/start"),
        api.http.get("/enroll/callback"),
        api.http.post("/enroll/confirm", content=b"decision=register"),
        api.http.get("/me"),
        api.http.post("/me/logout"),
        api.http.post(f"/me/orchestrators/{started['enrollId']}/revoke"),
        api.http.get("/me/signin"),
    ]
    browser.go(f"{api.url}/enroll")
    browser.go(f"{api.url}/enroll", method="POST", data={"code": code["userCode"]})
    back = sign_in(browser, started)
    answers.append(redeem(api, started["enrollId"], back["code"]))
    me_sign_in(api, linear, browser, "u-alice")
    answers += ours(api, browser)
    bad = [(str(r.request.url), r.status_code) for r in answers if not is_private(r)]
    assert bad == []
    assert {r.status_code for r in answers} >= {200, 201, 302, 303, 400, 401}


def test_the_sweep_forgets_unfinished_enrollments(api: Api, linear: LinearOAuth, browser: Browser) -> None:
    stale, fresh = ask(api), ask(api, port=None)
    browser.go(stale["startUrl"], stop_at=api.url)  # a sign-in left half-way
    browser.go(f"{api.url}/me/signin", stop_at=api.url)
    sql(
        api,
        "UPDATE enrollments SET created_at = now() - interval '2 hours', expires_at = now() - interval '110 minutes' "
        "WHERE id = %s",
        stale["enrollId"],
    )
    sql(api, "UPDATE signin_flows SET expires_at = now() - interval '2 hours'")
    assert api.http.post("/sweep", headers=api.admin()).status_code == 200
    assert [e["id"] for e in enrollments(api)] == [__import__("uuid").UUID(fresh["enrollId"])]
    with api.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM signin_flows").fetchone() == {"n": 0}
    assert redeem(api, stale["enrollId"]).json()["error"] == "invalid_grant"  # forgotten: nothing to redeem
