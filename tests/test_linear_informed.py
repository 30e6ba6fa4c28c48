"""Linear kept informed as Linear asks an agent to (agent-best-practices), against the stand-in
Linear that validates every call against Linear's schema: on delivery the issue moves to its
team's first started state (unless started, done or canceled), the app becomes the delegate of an
issue that has none, the agent session links to its page here; the agent's plan arrives as
`agentSessionUpdate`; a plain assignment gets an agent session of its own and the machine's replies
go to it; and a refusal from Linear holds back neither the delivery nor the other posts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from shared.wire import agent_tokens
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.linear import Linear, linear_settings

ROOT = Path(__file__).parent.parent
PUBLIC = "https://devpilot.example"
APP_USER = "app-user-devpilot"


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return linear_settings(httpserver, DEVPILOT_PUBLIC_URL=PUBLIC, DEVPILOT_MAX_ATTEMPTS=2)


@pytest.fixture
def app(api: Api, linear: Linear) -> Linear:
    """org-a connected as the app: its app user known, as the OAuth install learns it (`viewer`,
    test_oauth.py checks that part)."""
    with api.pool.connection() as conn:
        conn.execute("UPDATE linear_credentials SET app_user_id = %s WHERE org_id = 'org-a'", (APP_USER,))
    return linear


def until(check: Callable[[], Any], timeout: float = 10.0, sweep: Api | None = None) -> Any:
    """Wait for `check()` to be truthy (sweeping now and then, for what waits out a backoff)."""
    deadline = time.monotonic() + timeout
    last = 0.0
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if sweep is not None and time.monotonic() - last > 0.5:
            sweep.http.post("/sweep", headers=sweep.admin())
            last = time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {check()!r}")


def deliver(api: Api, token: str) -> dict[str, Any]:
    [m] = api.post_as(token, "/claim").json()["messages"]
    r = api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    assert r.json() == {"status": "acked"}
    message: dict[str, Any] = m
    return message


def posts(api: Api) -> list[dict[str, Any]]:
    with api.pool.connection() as conn:
        return [
            dict(r)
            for r in conn.execute(
                "SELECT id, kind, session_id, agent_session_id, sent_at, linear_id, attempts, last_error,"
                " available_at = 'infinity' AS given_up FROM linear_notices ORDER BY seq"
            )
        ]


def test_a_delivered_start_moves_the_issue_links_the_page_and_delegates(api: Api, app: Linear) -> None:
    _, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-1", issue_id="issue-todo"))
    m = deliver(api, token)
    until(lambda: app.called("issueUpdate") and len(app.called("issueUpdate")) == 2)
    until(lambda: app.called("agentSessionUpdate"))
    # The team's first started state is the lowest position (In Progress), not the first listed.
    assert {"id": "issue-todo", "input": {"stateId": "st-progress"}} in app.called("issueUpdate")
    assert {"id": "issue-todo", "input": {"delegateId": APP_USER}} in app.called("issueUpdate")
    assert app.called("agentSessionUpdate") == [
        {
            "id": "as-1",
            "input": {"externalUrls": [{"label": "devpilot", "url": f"{PUBLIC}/sessions/{m['sessionId']}"}]},
        }
    ]
    assert app.issues["issue-todo"]["stateId"] == "st-progress"
    # Started, done or canceled already, with a delegate: read, and left alone.
    for n, state in enumerate(("st-review", "st-done", "st-canceled")):
        issue = f"issue-{state}"
        app.issues[issue] = {"assignee": None, "stateId": state, "delegateId": "someone-else"}
        api.webhook(agent_session_event(creator="creator-1", session_id=f"as-x{n}", issue_id=issue))
        deliver(api, token)
    until(
        lambda: (
            len([p for p in posts(api) if p["kind"] in ("issue_started", "delegate") and p["sent_at"]]) == 8
        )
    )
    assert len(app.called("issueUpdate")) == 2  # nothing more was changed
    assert [p["linear_id"] for p in posts(api) if p["kind"] == "issue_started"][1:] == ["unchanged"] * 3
    assert {c["id"] for c in app.called("issue")} >= {"issue-st-review", "issue-st-done", "issue-st-canceled"}


def test_a_plan_posted_by_command_arrives_as_agent_session_update(api: Api, linear: Linear) -> None:
    orch, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-plan"))
    deliver(api, token)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DEVPILOT_PLAN_URL": api.url + "/plan",
        "DEVPILOT_AGENT_SESSION_ID": "as-plan",
        "DEVPILOT_AGENT_TOKEN": agent_tokens.mint(token, orch, "as-plan"),
    }
    cli = [sys.executable, "-m", "orchestrator.cli", "plan"]
    first = subprocess.run(
        [
            *cli,
            "--step",
            "Read the code:completed",
            "--step",
            "Write the fix:inProgress",
            "--step",
            "Open a PR",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert first.returncode == 0, first.stderr
    second_plan = '[{"content": "Read the code", "status": "completed"}, {"content": "Write the fix", "status": "completed"}]'
    second = subprocess.run(
        [*cli, "--file", "-"], input=second_plan, env=env, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 0, second.stderr
    until(lambda: len([u for u in linear.called("agentSessionUpdate") if "plan" in u["input"]]) == 2)
    plans = [u for u in linear.called("agentSessionUpdate") if "plan" in u["input"]]
    assert plans == [
        {
            "id": "as-plan",
            "input": {
                "plan": [
                    {"content": "Read the code", "status": "completed"},
                    {"content": "Write the fix", "status": "inProgress"},
                    {"content": "Open a PR", "status": "pending"},
                ]
            },
        },
        {
            "id": "as-plan",
            "input": {
                "plan": [
                    {"content": "Read the code", "status": "completed"},
                    {"content": "Write the fix", "status": "completed"},
                ]
            },
        },
    ]
    # Who may post, and the errors, as for /activities: nothing written for any of these.
    other = agent_tokens.mint(token, orch, "as-other")
    bad = {"agentSessionId": "as-plan", "plan": [{"content": "x", "status": "done"}]}
    assert api.post_as(token, "/plan", bad).status_code == 400
    assert api.post_as(token, "/plan", {"agentSessionId": "as-plan", "plan": []}).status_code == 400
    step = [{"content": "x", "status": "pending"}]
    assert api.post_as(other, "/plan", {"agentSessionId": "as-plan", "plan": step}).status_code == 404
    _, stranger = api.register(user="someone-else", name="other")
    assert api.post_as(stranger, "/plan", {"agentSessionId": "as-plan", "plan": step}).status_code == 404
    assert len([p for p in posts(api) if p["kind"] == "plan"]) == 2


def test_a_plain_assignment_gets_its_agent_session_and_the_replies_go_to_it(api: Api, app: Linear) -> None:
    orch, token = api.register(user="user-1", name="alice-laptop")
    app.refuse["agentSessionCreateOnIssue"] = "temporarily unavailable"  # Linear is slow to open it
    api.webhook(issue_event(issue_id="issue-plain", assignee="user-1"))
    m = deliver(api, token)
    assert m["agentSessionId"] is None  # a plain assignment: none when claimed
    # The machine speaks for it under the alias the orchestrator gives COMMAND: accepted at once
    # (the delivery and the agent are never held back), and held until Linear names the session.
    alias = f"devpilot:{m['sessionId']}"
    scoped = agent_tokens.mint(token, orch, alias)
    said = {"agentSessionId": alias, "content": {"type": "thought", "body": "Reading the issue"}}
    assert api.post_as(scoped, "/activities", said).status_code == 202
    until(lambda: app.refusals.get("agentSessionCreateOnIssue"))
    assert app.activities() == []
    del app.refuse["agentSessionCreateOnIssue"]
    until(lambda: app.called("agentSessionCreateOnIssue"), sweep=api)
    [opened] = app.called("agentSessionCreateOnIssue")
    assert opened == {
        "input": {
            "issueId": "issue-plain",
            "externalUrls": [{"label": "devpilot", "url": f"{PUBLIC}/sessions/{m['sessionId']}"}],
        }
    }
    agent = next(iter(app.sessions))
    until(lambda: app.activities())
    assert [(a["agentSessionId"], a["content"]["body"]) for a in app.activities()] == [
        (agent, "Reading the issue")
    ]
    # Later replies go straight to it; the issue is started and delegated as for a delegation.
    said = {"agentSessionId": alias, "content": {"type": "response", "body": "Done"}}
    assert api.post_as(scoped, "/activities", said).status_code == 202
    until(lambda: len(app.activities()) == 2)
    assert app.activities()[1]["agentSessionId"] == agent
    until(
        lambda: (
            app.issues["issue-plain"].get("delegateId") == APP_USER
            and app.issues["issue-plain"].get("stateId")
        )
    )
    with api.pool.connection() as conn:
        row = conn.execute("SELECT * FROM dispatch_sessions WHERE id = %s", (m["sessionId"],)).fetchone()
    assert row is not None and row["agent_session_id"] == agent and row["agent_session_created"]
    # A follow-up in that agent session reaches the machine that has the work.
    r = api.webhook(
        agent_session_event(action="prompted", session_id=agent, body="also the docs", issue_id="issue-plain")
    )
    assert r.json()["status"] == "dispatched" and r.json()["orchestratorId"] == orch
    # Its transcript, read back by the machine under the alias, is the agent session's.
    listed = api.http.get(
        "/activities", params={"agentSessionId": alias}, headers={"Authorization": f"Bearer {scoped}"}
    )
    assert [a["body"] for a in listed.json()["activities"] if a["from"] == "agent"] == [
        "Reading the issue",
        "Done",
    ]


def test_a_refusal_never_holds_back_the_delivery_or_the_other_posts(api: Api, app: Linear) -> None:
    for field in ("issueUpdate", "agentSessionUpdate"):
        app.refuse[field] = f"{field} is not allowed for this app"
    orch, token = api.register(user="creator-1", name="alice-laptop")
    api.webhook(agent_session_event(creator="creator-1", session_id="as-r"))
    deliver(api, token)  # delivered, whatever Linear says after
    scoped = agent_tokens.mint(token, orch, "as-r")
    for body in ("one", "two"):
        said = {"agentSessionId": "as-r", "content": {"type": "thought", "body": body}}
        assert api.post_as(scoped, "/activities", said).status_code == 202
    step = [{"content": "Fix it", "status": "inProgress"}]
    assert api.post_as(scoped, "/plan", {"agentSessionId": "as-r", "plan": step}).status_code == 202
    until(
        lambda: (
            [a["content"]["body"] for a in app.activities()]
            == ["Queued for alice-laptop", "Picked up by alice-laptop", "one", "two"]
        )
    )

    def given_up() -> list[dict[str, Any]]:
        refused = [
            p for p in posts(api) if p["kind"] in ("issue_started", "delegate", "external_urls", "plan")
        ]
        return refused if all(p["given_up"] for p in refused) else []

    refused = until(given_up, timeout=15, sweep=api)
    assert {p["kind"] for p in refused} == {"issue_started", "delegate", "external_urls", "plan"}
    assert all(p["attempts"] == 2 and p["sent_at"] is None for p in refused)
    assert all("not allowed for this app" in p["last_error"] for p in refused)  # Linear's own words
    # The page shows why.
    m_session = posts(api)[0]["session_id"]
    page = api.http.get(f"/sessions/{m_session}", headers=api.admin()).text
    assert (
        page.count("given up after 2 attempt(s)") == 4 and "issueUpdate is not allowed for this app" in page
    )


def test_without_the_app_a_plain_assignment_opens_no_agent_session(api: Api, linear: Linear) -> None:
    """A workspace connected with a static token (no app user): nothing opened, and the machine is
    told so (409) instead of its replies piling up unsent."""
    orch, token = api.register(user="user-1", name="alice-laptop")
    api.webhook(issue_event(issue_id="issue-static", assignee="user-1"))
    m = deliver(api, token)
    alias = f"devpilot:{m['sessionId']}"
    said = {"agentSessionId": alias, "content": {"type": "response", "body": "Finished."}}
    r = api.post_as(agent_tokens.mint(token, orch, alias), "/activities", said)
    assert r.status_code == 409 and r.json()["error"] == "linear_not_connected"
    assert [p["kind"] for p in posts(api)] == ["issue_started"]  # the issue is still started
    _, stranger = api.register(user="user-2", name="bob-laptop")  # and nobody else may use the name
    assert api.post_as(stranger, "/activities", {**said, "agentSessionId": alias}).status_code == 404


def test_a_stop_in_the_agent_session_opened_for_an_assignment_stops_its_agent(
    api: Api, app: Linear, tmp_path: Path
) -> None:
    """The stop button of the agent session devpilot opened for a plain assignment works as for a
    delegation: the machine's running COMMAND for that assignment is ended, and Linear hears it."""
    from tests.test_machine_conversations import COMMAND, starts
    from tests.test_orchestrator import Orch, wait_for

    _, token = api.register(user="user-1", name="alice-laptop")
    machine = Orch(api.url, token, tmp_path, extra=["--stop-grace", "2"], command=COMMAND)
    machine.start()
    try:
        event = issue_event(issue_id="issue-stop", assignee="user-1")
        event["data"]["title"] = "[sleep] the long migration"
        api.webhook(event)
        wait_for(lambda: app.sessions and starts(machine), 30, "the agent session opened and COMMAND started")
        [agent] = app.sessions
        [started] = starts(machine)
        assert started["env"]["DEVPILOT_AGENT_SESSION_ID"].startswith("devpilot:")
        r = api.webhook(
            agent_session_event(action="prompted", session_id=agent, signal="stop", issue_id="issue-stop")
        )
        assert r.json()["status"] == "stopped" and r.json()["stopSessionId"]

        def said_stopped() -> bool:
            return ("response", "Stopped, as asked in Linear.") in [
                (a["content"]["type"], a["content"].get("body"))
                for a in app.activities()
                if a["agentSessionId"] == agent
            ]

        wait_for(said_stopped, 30, "Linear told, in the agent session devpilot opened")

        def gone() -> bool:
            try:
                os.kill(started["pid"], 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, 10, "the assignment's COMMAND ended")
        assert len(starts(machine)) == 1  # the stop started no COMMAND of its own
    finally:
        machine.stop()
