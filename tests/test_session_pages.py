"""A page per session, and operators acting on it, in a real browser (headless Chromium through
Selenium, one browser for the module) against the real service, a real machine (the orchestrator
process) and the stand-in Linear: the page of a conversation with a retried message, a failed
attempt and five activities, read back from the page; retry of a dead letter, cancel and move from
the page's buttons, each ending where it should (delivered by the machine, or Linear told); and the
same actions as admin routes and `devpilot sessions`, with their refusals; 404 for anyone else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer

from functions.pages import ME_COOKIE
from shared.delivery.intake import prune_deliveries
from shared.fleet import people
from shared.plumbing.db import transaction
from shared.wire import agent_tokens
from tests.helpers.api import ADMIN, Api, agent_session_event, issue_event
from tests.helpers.chromium import headless_chromium
from tests.helpers.data import queue_of
from tests.helpers.linear import Linear, linear_settings
from tests.test_orchestrator import ROOT, Orch, wait_for

PUBLIC = "https://devpilot.example"
SCREENSHOT = ROOT / "docs" / "session-page.png"


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return linear_settings(
        httpserver, DEVPILOT_PUBLIC_URL=PUBLIC, DEVPILOT_MAX_ATTEMPTS=2, DEVPILOT_BACKOFF_BASE_SECONDS=0
    )


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the module (starting one is the slow part)."""
    driver = headless_chromium(tmp_path_factory.mktemp("chromium") / "profile", "1500,1000")
    yield driver
    driver.quit()


def by(kind: str) -> Any:
    from selenium.webdriver.common.by import By

    return getattr(By, kind)


def sign_in(driver: Any, api: Api) -> None:
    driver.delete_all_cookies()
    driver.get(api.url + "/dashboard/login")
    driver.find_element(by("ID"), "token").send_keys(ADMIN)
    driver.find_element(by("ID"), "signin").click()
    wait_for(
        lambda: "/dashboard" in driver.current_url and "Orchestrators" in driver.page_source, 15, "login"
    )


def text_of(driver: Any, css: str) -> str:
    """The element's text; empty while the page it was on is being replaced (after a form post)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element(by("CSS_SELECTOR"), css).text)
    except (StaleElementReferenceException, NoSuchElementException):
        return ""


def deliver(api: Api, token: str) -> dict[str, Any]:
    [m] = api.post_as(token, "/claim").json()["messages"]
    assert (
        api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]}).status_code
        == 200
    )
    message: dict[str, Any] = m
    return message


def status(api: Api, session_id: str) -> str:
    with api.pool.connection() as conn:
        row = conn.execute("SELECT status FROM dispatch_sessions WHERE id = %s", (session_id,)).fetchone()
    assert row is not None
    return str(row["status"])


def dead_letter(api: Api, token: str, reason: str) -> dict[str, Any]:
    """The machine takes the message and gives it back until it is dead-lettered (2 attempts)."""
    for _ in range(2):
        [m] = api.post_as(token, "/claim").json()["messages"]
        api.post_as(
            token, "/release", {"queueId": m["queueId"], "claimToken": m["claimToken"], "reason": reason}
        )
    message: dict[str, Any] = m
    return message


def test_the_page_of_a_conversation_read_back_from_the_browser(
    api: Api, linear: Linear, browser: Any, tmp_path: Path
) -> None:
    orch, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-page", issue_id="issue-page"))
    [first] = api.post_as(token, "/claim").json()["messages"]
    api.post_as(
        token,
        "/release",
        {"queueId": first["queueId"], "claimToken": first["claimToken"], "reason": "disk full on /work"},
    )
    m = deliver(api, token)  # the second attempt: the message retried, then delivered
    scoped = agent_tokens.mint(token, orch, "as-page")
    allow_deny = {
        "signal": "select",
        "signalMetadata": {"options": [{"label": "Allow", "value": "Allow"}, {"value": "Deny"}]},
    }
    plan = [
        {"content": "Reproduce the flake", "status": "completed"},
        {"content": "Fix it", "status": "inProgress"},
    ]
    for content, extra in (
        ({"type": "thought", "body": "Reading the failing test"}, {}),
        (
            {
                "type": "action",
                "action": "Bash",
                "parameter": "pytest tests/test_flaky.py",
                "result": "1 failed",
            },
            {},
        ),
        (
            {"type": "elicitation", "body": "Claude Code asks to use Bash: `rm -rf .cache`. Allow it?"},
            allow_deny,
        ),
        ({"type": "thought", "body": "Allowed in Linear: Bash `rm -rf .cache`"}, {"ephemeral": True}),
        (
            {
                "type": "response",
                "body": "Fixed the race in the fixture; the test passes 200 times in a row.",
            },
            {},
        ),
    ):
        body = {"agentSessionId": "as-page", "content": content, **extra}
        assert api.post_as(scoped, "/activities", body).status_code == 202
        if extra.get("ephemeral"):  # (sent before the next: unsent, the response would supersede it)
            wait_for(
                lambda c=content: c["body"] in [a["content"].get("body") for a in linear.activities()],
                10,
                "the ephemeral thought in Linear",
            )
        if content["type"] == "elicitation":
            assert (
                api.post_as(scoped, "/plan", {"agentSessionId": "as-page", "plan": plan}).status_code == 202
            )
    with api.pool.connection() as conn:  # a person of the workspace signed in once: its name is known
        conn.execute(
            "INSERT INTO linear_people (org_id, linear_user_id, name, workspace_name)"
            " VALUES ('org-a', 'creator-1', 'Alice', 'Acme Robotics')"
        )
    api.webhook(
        agent_session_event(
            action="prompted", session_id="as-page", body="also the docs", issue_id="issue-page"
        )
    )
    wait_for(lambda: len(linear.activities()) == 7, 10, "seven activities in Linear")

    sign_in(browser, api)
    browser.get(f"{api.url}/sessions/{m['sessionId']}")
    assert text_of(browser, "#machine") == "alice-laptop" and "ENG-7" in text_of(browser, "#issue")
    assert text_of(browser, "#workspace") == "Acme Robotics"
    messages = browser.find_elements(by("CSS_SELECTOR"), "#messages tr[data-session]")
    assert [r.find_element(by("CSS_SELECTOR"), "td:nth-child(2)").text for r in messages] == [
        "start",
        "prompt",
    ]
    assert [r.find_element(by("CSS_SELECTOR"), ".status").text for r in messages] == ["delivered", "queued"]
    claims = messages[0].find_element(by("CSS_SELECTOR"), ".attempts").text
    assert "attempt 1" in claims and "disk full on /work" in claims and "acked" in claims
    rows = browser.find_elements(by("CSS_SELECTOR"), "#posts tr[data-post]")
    said = [
        (r.find_element(by("CSS_SELECTOR"), ".type").text, r.find_element(by("CSS_SELECTOR"), ".body").text)
        for r in rows
    ]
    activities = [
        s for s in said if s[0] in ("thought", "action", "response", "error", "elicitation", "plan")
    ]
    assert activities == [  # as Linear shows them: the tool, its parameter and result; the options; the plan
        ("thought", "Queued for alice-laptop"),
        ("thought", "Picked up by alice-laptop"),
        ("thought", "Reading the failing test"),
        ("action", "Bash pytest tests/test_flaky.py\n1 failed"),
        ("elicitation", "Claude Code asks to use Bash: `rm -rf .cache`. Allow it?\nAllow\nDeny"),
        ("plan", "Reproduce the flake (completed)\nFix it (inProgress)"),
        ("thought", "Allowed in Linear: Bash `rm -rf .cache` (ephemeral)"),
        ("response", "Fixed the race in the fixture; the test passes 200 times in a row."),
    ]
    assert {"issue_started", "external_urls"} <= {s[0] for s in said}

    def all_sent() -> bool:
        browser.refresh()
        return all(
            r.text.startswith("sent") for r in browser.find_elements(by("CSS_SELECTOR"), "#posts .state")
        )

    wait_for(all_sent, 10, "every post shown sent")
    # (operators see the actions the session's state allows: a delivered start has none)
    assert browser.find_elements(by("ID"), "no-actions")
    shot = tmp_path / "session-page.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    if os.environ.get("DEVPILOT_UPDATE_SCREENSHOTS") == "1":  # the README's picture
        shutil.copy(shot, SCREENSHOT)


def test_retry_of_a_dead_letter_from_the_page_ends_delivered_by_the_machine(
    api: Api, linear: Linear, browser: Any, tmp_path: Path
) -> None:
    _, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-dead"))
    m = dead_letter(api, token, "the machine crashed")
    assert status(api, m["sessionId"]) == "failed"
    machine = Orch(api.url, token, tmp_path)  # the machine, back
    machine.start()
    try:
        sign_in(browser, api)
        browser.get(f"{api.url}/sessions/{m['sessionId']}")
        assert "the machine crashed" in text_of(browser, "#dead-letter")
        assert "Agent task" in text_of(browser, "#issue")  # its title, from the dead letter's message
        browser.find_element(by("ID"), "retry").click()
        wait_for(lambda: status(api, m["sessionId"]) == "delivered", 30, "the retried message delivered")
        browser.get(f"{api.url}/sessions/{m['sessionId']}")
        assert text_of(browser, "#status") == "delivered"
        assert "retry" in text_of(browser, "#actions") and "queued again on alice-laptop" in text_of(
            browser, "#actions"
        )
        wait_for(machine.starts, 15, "the agent started")
        [started] = machine.starts()
        assert started["messageId"] == m["messageId"]  # the same message, a new queue row
        with api.pool.connection() as conn:  # attempts from 0: delivered at its first new claim
            row = conn.execute(
                "SELECT count(*) AS n FROM dispatch_attempts WHERE session_id = %s", (m["sessionId"],)
            ).fetchone()
        assert row is not None and row["n"] == 2  # the two before the dead letter, none since
        assert "claimed ENG-7 (attempt 1)" in machine.log_file.read_text()
    finally:
        machine.stop()
    wait_for(
        lambda: (
            ("thought", "Retrying on alice-laptop")
            in [(a["content"]["type"], a["content"]["body"]) for a in linear.activities()]
        ),
        10,
        "Linear told",
    )


def test_cancel_and_move_from_the_page(api: Api, linear: Linear, browser: Any, tmp_path: Path) -> None:
    _, desktop_token = api.register(user="user-1", name="alice-desktop")
    laptop, _ = api.register(user="user-1", name="alice-laptop")
    moving = api.webhook(issue_event(issue_id="issue-move", assignee="user-1")).json()
    cancelling = api.webhook(agent_session_event(creator="user-1", session_id="as-cancel")).json()
    assert moving["orchestratorId"] == laptop  # (neither seen yet: the newest registration)
    sign_in(browser, api)
    browser.get(f"{api.url}/sessions/{cancelling['sessionId']}")
    browser.find_element(by("ID"), "cancel").click()
    wait_for(lambda: "cancelled" in text_of(browser, "#status"), 10, "the page after cancel")
    assert status(api, cancelling["sessionId"]) == "cancelled"
    wait_for(
        lambda: (
            ("response", "Cancelled by an operator before any machine started working on it.")
            in [(a["content"]["type"], a["content"].get("body")) for a in linear.activities()]
        ),
        10,
        "Linear told",
    )

    browser.get(f"{api.url}/sessions/{moving['sessionId']}")
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element(by("ID"), "move-to")).select_by_visible_text("alice-desktop")
    browser.find_element(by("ID"), "move").click()
    wait_for(lambda: text_of(browser, "#machine") == "alice-desktop", 10, "the page after the move")
    assert "moved to alice-desktop" in text_of(browser, "#actions")
    machine = Orch(api.url, desktop_token, tmp_path)
    machine.start()
    try:
        wait_for(lambda: status(api, moving["sessionId"]) == "delivered", 30, "the moved start delivered")
    finally:
        machine.stop()


def test_admin_routes_cli_csrf_and_404(api: Api, linear: Linear, db_url: str) -> None:
    """The same actions without a browser: JSON answers, `409 not_allowed` when the state does not
    allow it, the CSRF token a cookie session's form needs, no GET that changes anything, `devpilot
    sessions` on the command line; and 404 for anyone not allowed to see the page."""
    other, _ = api.register(user="creator-1", name="alice-desktop")
    laptop, token = api.register(user="creator-1", name="alice-laptop")
    queued = api.webhook(agent_session_event(creator="creator-1", session_id="as-q")).json()
    sid = queued["sessionId"]
    assert queued["orchestratorId"] == laptop
    r = api.http.post(f"/sessions/{sid}/move", json={"orchestratorId": laptop}, headers=api.admin())
    assert r.status_code == 409 and r.json()["error"] == "not_allowed"  # where it is already
    bobs, _ = api.register(user="bob", name="bob-laptop")
    r = api.http.post(f"/sessions/{sid}/move", json={"orchestratorId": bobs}, headers=api.admin())
    assert r.status_code == 409 and r.json()["error"] == "not_allowed"  # only to the same user's machines
    for path in (f"/sessions/{sid}/retry", f"/sessions/{sid}/cancel", f"/sessions/{sid}/move"):
        assert api.http.get(path, headers=api.admin()).status_code == 405  # a GET changes nothing
    r = api.http.post(f"/sessions/{sid}/retry", headers=api.admin())
    assert r.status_code == 409 and r.json()["error"] == "not_allowed"  # not failed
    r = api.http.post(f"/sessions/{sid}/move", json={"orchestratorId": other}, headers=api.admin())
    moved_to = r.json()
    assert r.status_code == 200 and moved_to["status"] == "queued" and moved_to["sessionId"] == sid
    # From a cookie session (the page), only with the page's CSRF token.
    login = api.http.post(
        "/dashboard/login",
        content=f"token={ADMIN}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    cookie = {"Cookie": "devpilot_dashboard=" + login.headers["set-cookie"].split(";")[0].split("=", 1)[1]}
    form = {"Content-Type": "application/x-www-form-urlencoded", **cookie}
    assert api.http.post(f"/sessions/{sid}/cancel", content="csrf=forged", headers=form).status_code == 403
    assert status(api, sid) == "queued"
    page = api.http.get(f"/sessions/{sid}", headers=cookie)
    assert page.headers["cache-control"] == "no-store" and page.headers["referrer-policy"] == "no-referrer"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    r = api.http.post(f"/sessions/{sid}/cancel", content=f"csrf={csrf}", headers=form)
    assert r.status_code == 303 and status(api, sid) == "cancelled"
    r = api.http.post(f"/sessions/{sid}/cancel", content=f"csrf={csrf}", headers=form)
    assert r.status_code == 409 and "only a queued session" in r.text
    # The command line, on a dead letter; each action recorded with who did it.
    api.webhook(agent_session_event(creator="creator-1", session_id="as-cli"))
    dead = dead_letter(api, token, "oom")

    def retry() -> subprocess.CompletedProcess[str]:  # `devpilot sessions retry`, as an operator runs it
        return subprocess.run(
            [sys.executable, "-m", "devpilot", "sessions", "retry", dead["sessionId"]],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": db_url},
            capture_output=True,
            text=True,
            timeout=60,
        )

    run = retry()
    assert run.returncode == 0 and "queued again" in run.stdout, run.stderr
    assert status(api, dead["sessionId"]) == "queued"
    again = retry()
    assert again.returncode == 1 and "not allowed" in again.stderr
    with api.pool.connection() as conn:
        acts = [dict(r) for r in conn.execute("SELECT action, actor FROM session_actions ORDER BY id")]
    assert [a["action"] for a in acts] == ["move", "cancel", "retry"]
    assert acts[0]["actor"] == "admin bearer" and acts[1]["actor"].startswith("dashboard session ")
    assert acts[2]["actor"].startswith("cli ")
    # Anyone else: 404, the same answer as no session at all.
    for headers in ({}, {"Cookie": "devpilot_dashboard=not-a-session"}):
        assert api.http.get(f"/sessions/{sid}", headers=headers).status_code == 404
        assert api.http.get("/sessions", params={"q": "ENG-7"}, headers=headers).status_code == 404
        assert api.http.post(f"/sessions/{sid}/retry", headers=headers).status_code == 404
    assert api.http.get(f"/sessions/{sid}", headers={"Authorization": "Bearer wrong"}).status_code == 401

    # A person signed in with Linear (a /me session, as the sign-in of tests/test_enroll.py makes
    # it): their workspace's sessions only, and no actions.
    def signed_in_as(org: str, user: str) -> dict[str, str]:
        with transaction(api.pool) as tx:
            session = people.start_session(tx, org, user)
        return {"Cookie": f"{ME_COOKIE}={session}"}

    outsider, member = signed_in_as("org-b", "bob"), signed_in_as("org-a", "carol")
    assert api.http.get(f"/sessions/{sid}", headers=outsider).status_code == 404
    mine = api.http.get(f"/sessions/{sid}", headers=member)
    assert mine.status_code == 200 and 'id="cancel"' not in mine.text and "alice" in mine.text
    assert api.http.post(f"/sessions/{dead['sessionId']}/cancel", headers=member).status_code == 404
    found = api.http.get("/sessions", params={"q": "alice-laptop"}, headers=outsider)
    assert found.status_code == 200 and "no session found" in found.text
    found = api.http.get("/sessions", params={"q": "eng-7"}, headers=api.admin())
    assert found.text.count('<a href="/sessions/') == 2  # by issue identifier, any case
    found = api.http.get("/sessions", params={"q": "as-cli"}, headers=api.admin())
    assert (
        found.text.count('<a href="/sessions/') == 1 and dead["sessionId"] in found.text
    )  # by agent session id
    found = api.http.get("/sessions", params={"q": "ALICE-DESKTOP"}, headers=api.admin())
    assert found.text.count('<a href="/sessions/') == 1 and sid in found.text  # by machine (moved there)


@pytest.mark.parametrize("since", ["follow_up", "stop"])
def test_retry_of_a_start_whose_conversation_went_on_without_it_is_refused(
    api: Api, linear: Linear, since: str
) -> None:
    """A start dead-lettered, and then, in Linear, the person wrote a follow-up (no machine had the
    conversation, so it started it afresh) or pressed stop. Retrying the dead start would start the
    conversation a second time, or start work the person stopped: the retry is refused (409, the
    reason said) and writes nothing."""
    _, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-again"))
    dead = dead_letter(api, token, "the machine crashed")
    assert status(api, dead["sessionId"]) == "failed"
    if since == "follow_up":
        later = api.webhook(
            agent_session_event(
                creator="creator-1", session_id="as-again", action="prompted", body="try again?"
            )
        )
        assert later.json()["status"] == "dispatched", later.text
    else:
        stop = api.webhook(
            agent_session_event(creator="creator-1", session_id="as-again", action="prompted", signal="stop")
        )
        assert stop.status_code == 200, stop.text

    queued = queue_of(api.pool)
    for week_on in (None, datetime.now(UTC) + timedelta(days=8)):
        if week_on is not None:  # the sweep has forgotten the deliveries and the stop's record
            prune_deliveries(api.pool, api.settings, now=week_on)
        r = api.http.post(f"/sessions/{dead['sessionId']}/retry", headers=api.admin())
        assert r.status_code == 409, r.text
        reason = "went on without it" if since == "follow_up" else "stopped in Linear"
        assert r.json()["error"] == "not_allowed" and reason in r.json()["detail"], r.text
        assert status(api, dead["sessionId"]) == "failed"
        assert queue_of(api.pool) == queued  # (the follow-up's fresh start, or nothing, as before)
    assert len(queued) == (1 if since == "follow_up" else 0)


def test_a_start_stopped_before_migration_0017_is_not_retried_after_it(api: Api, linear: Linear) -> None:
    """A dead letter whose agent session was stopped before the upgrade that added the stop's mark
    is marked by the migration (from the stop's record, while it is kept): its retry is refused."""
    _, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-upgraded"))
    dead = dead_letter(api, token, "the machine crashed")
    stop = agent_session_event(
        creator="creator-1", session_id="as-upgraded", action="prompted", signal="stop"
    )
    assert api.webhook(stop).status_code == 200
    migration = Path(__file__).parent.parent / "infra" / "migrations" / "0017_stopped_dead_letters.sql"
    with transaction(api.pool) as tx:  # (the schema before 0017, with this data; then 0017)
        tx.execute("ALTER TABLE dead_letters DROP COLUMN stopped_at")
        tx.execute(migration.read_text())
    r = api.http.post(f"/sessions/{dead['sessionId']}/retry", headers=api.admin())
    assert r.status_code == 409 and "stopped in Linear" in r.json()["detail"], r.text


@pytest.mark.parametrize("stopped", [False, True])
def test_a_follow_up_failed_with_its_start_is_retried_only_after_it(
    api: Api, linear: Linear, stopped: bool
) -> None:
    """A follow-up queued behind its start fails with it. Retried first, it would reach a machine
    that never started the conversation: refused (409) until its start is retried; then both are
    delivered in order, the start first. Once the person stopped the agent session, neither is
    retried."""
    _, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-both"))
    behind = api.webhook(
        agent_session_event(creator="creator-1", session_id="as-both", action="prompted", body="and also?")
    ).json()
    assert behind["status"] == "dispatched", behind
    start = dead_letter(api, token, "the machine crashed")
    assert status(api, start["sessionId"]) == "failed" and status(api, behind["sessionId"]) == "failed"
    if stopped:
        stop = api.webhook(
            agent_session_event(creator="creator-1", session_id="as-both", action="prompted", signal="stop")
        )
        assert stop.status_code == 200, stop.text

    def retry(sid: str) -> httpx.Response:
        return api.http.post(f"/sessions/{sid}/retry", headers=api.admin())

    first = retry(behind["sessionId"])
    assert first.status_code == 409, first.text
    assert ("stopped in Linear" if stopped else "retry the start") in first.json()["detail"], first.text
    if stopped:
        assert retry(start["sessionId"]).status_code == 409
        assert api.post_as(token, "/claim").json()["messages"] == []
        return
    assert retry(start["sessionId"]).status_code == 200
    assert retry(behind["sessionId"]).status_code == 200
    got = []
    for _ in range(2):  # one at a time: a message waits for the one before it in its agent session
        [m] = api.post_as(token, "/claim").json()["messages"]
        assert (
            api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]}).status_code
            == 200
        )
        got.append((m["kind"], m["sessionId"]))
    assert got == [("start", start["sessionId"]), ("prompt", behind["sessionId"])]


def test_retry_routes_a_start_again_when_its_machine_was_revoked(api: Api, linear: Linear) -> None:
    desktop, _ = api.register(user="creator-1", name="alice-desktop")
    laptop, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-revoked"))
    dead = dead_letter(api, token, "laptop stolen")
    assert dead["orchestratorId"] == laptop
    assert api.http.post(f"/orchestrators/{laptop}/revoke", headers=api.admin()).status_code == 200
    r = api.http.post(f"/sessions/{dead['sessionId']}/retry", headers=api.admin())
    assert r.status_code == 200 and r.json()["detail"] == "queued again on alice-desktop"
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT s.orchestrator_id, q.attempts, q.message_id FROM dispatch_sessions s"
            " JOIN dispatch_queue q ON q.session_id = s.id WHERE s.id = %s",
            (dead["sessionId"],),
        ).fetchone()
    assert row is not None and (str(row["orchestrator_id"]), row["attempts"]) == (desktop, 0)
    assert str(row["message_id"]) == dead["messageId"]


def test_the_page_says_when_linear_is_not_connected_and_where_to_connect_it(api: Api) -> None:
    """Nothing reaches Linear from a workspace that never connected it (or whose connection is
    gone): the page says so, and where an admin connects it, instead of "nothing posted"."""
    _, token = api.register()
    sid = api.webhook(issue_event()).json()["sessionId"]
    deliver(api, token)

    def page() -> str:
        r = api.http.get(f"/sessions/{sid}", headers=api.admin())
        assert r.status_code == 200
        return r.text

    text = page()
    assert "Linear is not connected for this workspace" in text and 'href="/oauth/install"' in text
    assert "nothing posted to Linear" not in text
    r = api.http.post(
        "/linear-credentials", json={"orgId": "org-a", "accessToken": "lin-x"}, headers=api.admin()
    )
    assert r.status_code == 200, r.text
    text = page()
    assert "not connected" not in text and "/oauth/install" not in text
    with api.pool.connection() as conn:
        conn.execute(
            "UPDATE linear_credentials SET disconnected_at = now(), disconnect_reason = 'refresh refused'"
        )
    text = page()
    assert "Linear is disconnected for this workspace (refresh refused)" in text and "/oauth/install" in text
