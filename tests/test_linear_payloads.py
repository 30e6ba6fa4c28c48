"""Linear's payloads read as Linear sends them, over real HTTP against real Postgres and a stand-in
Linear that checks every GraphQL document against Linear's schema: the request of an agent session
is Linear's promptContext (never the thread's root comment); a session an automation started goes
to the issue's assignee, whom only Linear's API can name (asked after the webhook's transaction);
signals in and out; two webhook secrets; another app's uninstall; a personal API key sent raw."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from shared.delivery.routing import NO_ASSIGNEE, NOT_CONNECTED
from shared.linear import auth as linear_auth
from shared.plumbing.db import transaction
from tests.helpers.api import ROOT_PLACEHOLDER, SECRET, Api, agent_session_event, app_revoked_event
from tests.helpers.data import row_counts
from tests.helpers.linear import Linear, linear_settings
from tests.test_orchestrator import wait_for

SECOND_SECRET = "the-oauth-apps-own-signing-secret"


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return linear_settings(
        httpserver, LINEAR_WEBHOOK_SECRET=f"{SECRET}, {SECOND_SECRET}", LINEAR_CLIENT_ID="our-client-id"
    )


def wait_said(linear: Linear, agent_session: str, n: int, timeout: float = 10.0) -> list[tuple[str, str]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(linear.said(agent_session)) < n:
        time.sleep(0.02)
    assert not linear.invalid, linear.invalid
    return linear.said(agent_session)


def assignee_reads(linear: Linear) -> list[dict[str, Any]]:
    """The variables of each read of an issue's assignee (the routing's, not the delivery's reads
    of the issue's state and delegate)."""
    return [c.get("variables") or {} for c in linear.calls if "DevpilotIssueAssignee" in c["query"]]


def sweep(api: Api) -> None:
    r = api.http.post("/sweep", headers=api.admin())
    assert r.status_code == 200, r.text


# --- the request is what Linear means by the request ----------------------------------------------


def test_a_delegation_hands_the_agent_linears_request_not_the_placeholder(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    event = agent_session_event(session_id="as-delegated")  # delegated: no comment asked
    assert api.webhook(event).json()["status"] == "dispatched"
    [m] = api.claim_all(token)
    assert m["prompt"]["context"] == event["promptContext"]
    assert m["prompt"]["body"] is None
    assert ROOT_PLACEHOLDER not in str(m["prompt"])  # Linear's placeholder reaches nobody


def test_a_mention_in_a_reply_is_the_reply_not_the_threads_first_comment(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    event = agent_session_event(
        session_id="as-reply", body="@agent please rebase it", in_reply_to="The deploy broke on Friday."
    )
    api.webhook(event)
    [m] = api.claim_all(token)
    assert m["prompt"]["body"] == "@agent please rebase it"
    assert m["prompt"]["previousComments"] == event["previousComments"]
    assert "The deploy broke on Friday." not in (m["prompt"]["body"] or "")


# --- sessions started by an automation ------------------------------------------------------------


def test_an_automation_session_goes_to_the_issues_assignee_and_linear_hears_at_once(
    api: Api, linear: Linear
) -> None:
    linear.issues["iss-auto"] = {"assignee": {"id": "assignee-1", "name": "Ada"}}
    _, token = api.register(user="assignee-1", name="ada-laptop")
    event = agent_session_event(session_id="as-auto", creator=None, issue_id="iss-auto")
    t0 = time.monotonic()
    r = api.webhook(event, delivery="d-auto")
    assert r.status_code == 200 and r.json()["status"] == "routing"
    assert wait_said(linear, "as-auto", 1) == [("thought", "Queued for ada-laptop")]
    assert time.monotonic() - t0 < 10  # Linear's limit for a first activity
    assert assignee_reads(linear) == [{"id": "iss-auto"}]  # asked of Linear, the read schema-checked
    [m] = api.claim_all(token)
    assert (m["kind"], m["agentSessionId"], m["prompt"]["context"]) == (
        "start",
        "as-auto",
        event["promptContext"],
    )
    again = api.webhook(event, delivery="d-auto").json()  # Linear's retry of the same delivery
    assert again == {"status": "duplicate", "sessionId": m["sessionId"]}
    assert row_counts(api.pool)["sessions"] == 1


@pytest.mark.parametrize(
    ("assignee", "reason"),
    [(None, NO_ASSIGNEE), ({"id": "nobodys-machine", "name": "Bo"}, "No machine is registered")],
)
def test_an_automation_session_nothing_can_take_tells_linear_the_true_reason(
    api: Api, linear: Linear, assignee: dict[str, str] | None, reason: str
) -> None:
    api.register(user="user-1")
    linear.issues["iss-x"] = {"assignee": assignee}
    api.webhook(agent_session_event(session_id="as-x", creator=None, issue_id="iss-x"))
    [(kind, body)] = wait_said(linear, "as-x", 1)
    assert kind == "error" and reason in body
    assert row_counts(api.pool)["sessions"] == 0 and row_counts(api.pool)["queue"] == 0


def test_an_automation_session_in_a_disconnected_workspace_says_why_once_it_can(
    api: Api, linear: Linear
) -> None:
    """The workspace's connection was revoked (the app uninstalled, or a refresh refused): Linear
    cannot be asked whose the issue is. Nothing is queued. The reason is written for Linear and held
    until a new install can post it (posting needs the connection), so it is not lost."""
    api.register(user="user-1")
    linear.issues["iss-nc"] = {"assignee": {"id": "user-1", "name": "Al"}}
    with transaction(api.pool) as tx:
        assert linear_auth.disconnect(tx, "org-a", "the app was uninstalled")
    answer = api.webhook(agent_session_event(session_id="as-nc", creator=None, issue_id="iss-nc")).json()
    assert answer["status"] == "routing"

    def held() -> list[dict[str, Any]]:
        with api.pool.connection() as conn:
            return conn.execute(
                "SELECT body, sent_at FROM linear_notices WHERE agent_session_id = 'as-nc'"
            ).fetchall()

    wait_for(held, 10, "the reason written for Linear")
    assert [(h["body"], h["sent_at"]) for h in held()] == [(NOT_CONNECTED, None)]
    assert assignee_reads(linear) == [] and linear.activities() == []
    assert row_counts(api.pool)["sessions"] == 0 and row_counts(api.pool)["queue"] == 0


def test_linear_down_the_session_is_routed_once_linear_answers(api: Api, linear: Linear) -> None:
    """The read fails (Linear down): nothing is lost, the webhook was answered, and the sweep
    routes it once Linear answers; a follow-up sent meanwhile waits behind the start and a retried
    delivery changes nothing: one start, one prompt, in order, on the assignee's machine."""
    linear.issues["iss-down"] = {"assignee": {"id": "assignee-2", "name": "Cy"}}
    _, token = api.register(user="assignee-2", name="cy-laptop")
    linear.fail = 1  # the read right after the commit gets a 500
    created = agent_session_event(session_id="as-down", creator=None, issue_id="iss-down")
    assert api.webhook(created, delivery="d-created").json()["status"] == "routing"
    # (a follow-up that names a person: still the conversation's, queued behind its start)
    follow_up = agent_session_event(
        session_id="as-down", action="prompted", creator="user-9", body="and the docs"
    )
    assert api.webhook(follow_up, delivery="d-follow").json()["status"] == "routing"
    assert api.webhook(created, delivery="d-created").json()["status"] == "duplicate"
    time.sleep(0.3)
    assert api.claim_all(token) == [] and linear.fail == 0
    time.sleep(1.1)  # the backoff after the first failed read (base 1 s here)
    sweep(api)
    assert wait_said(linear, "as-down", 1) == [("thought", "Queued for cy-laptop")]
    [start] = api.claim_all(token)  # the prompt waits for the start's delivery (order rule)
    assert start["kind"] == "start"
    assert api.post_as(
        token, "/ack", {"queueId": start["queueId"], "claimToken": start["claimToken"]}
    ).json() == {"status": "acked"}
    [prompt] = api.claim_all(token)
    assert (prompt["kind"], prompt["prompt"]["body"]) == ("prompt", "and the docs")
    sweep(api)
    assert row_counts(api.pool)["sessions"] == 2
    assert len(assignee_reads(linear)) == 1  # answered once; the follow-up went to the holder, unasked


def test_a_stop_cancels_a_session_still_waiting_for_linear(api: Api, linear: Linear) -> None:
    linear.issues["iss-stop"] = {"assignee": {"id": "assignee-3", "name": "Di"}}
    _, token = api.register(user="assignee-3")
    linear.fail = 1
    api.webhook(agent_session_event(session_id="as-stop", creator=None, issue_id="iss-stop"))
    time.sleep(0.3)
    r = api.webhook(agent_session_event(session_id="as-stop", action="prompted", creator=None, signal="stop"))
    assert r.json()["status"] == "stopped"
    time.sleep(1.1)
    sweep(api)
    assert api.claim_all(token) == []
    assert row_counts(api.pool)["sessions"] == 0
    assert [k for k, _ in wait_said(linear, "as-stop", 1)] == ["response"]


# --- signals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "metadata"),
    [("continue", None), ("select", {"value": "Postgres"}), ("auth", {"providerName": "GitHub"})],
)
def test_a_follow_up_carries_its_signal(api: Api, signal: str, metadata: dict[str, str] | None) -> None:
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-sig"))
    [start] = api.claim_all(token)
    api.post_as(token, "/ack", {"queueId": start["queueId"], "claimToken": start["claimToken"]})
    event = agent_session_event(
        session_id="as-sig", action="prompted", body="Postgres", signal=signal, signal_metadata=metadata
    )
    assert api.webhook(event).json()["kind"] == "prompt"
    [m] = api.claim_all(token)
    assert (m["prompt"]["body"], m["prompt"]["signal"], m["prompt"]["signalMetadata"]) == (
        "Postgres",
        signal,
        metadata,
    )


def test_the_agent_asks_with_select_and_auth_signals(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-ask"))
    [m] = api.claim_all(token)
    api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    ask = {"type": "elicitation", "body": "Which database?"}
    options = {"options": [{"label": "Postgres", "value": "Postgres"}, {"value": "SQLite"}]}
    r = api.post_as(
        token,
        "/activities",
        {"agentSessionId": "as-ask", "content": ask, "signal": "select", "signalMetadata": options},
    )
    assert r.status_code == 202, r.text
    link = {"url": "https://github.com/login/oauth/authorize?client_id=x", "providerName": "GitHub"}
    r = api.post_as(
        token,
        "/activities",
        {"agentSessionId": "as-ask", "content": ask, "signal": "auth", "signalMetadata": link},
    )
    assert r.status_code == 202, r.text
    before = row_counts(api.pool)["notices"]
    for bad in (
        {"content": {"type": "thought", "body": "hm"}, "signal": "select", "signalMetadata": options},
        {"content": ask, "signal": "select", "signalMetadata": {"options": []}},
        {"content": ask, "signal": "auth", "signalMetadata": {"url": "javascript:alert(1)"}},
        {"content": ask, "signal": "stop"},
        {"content": ask, "signalMetadata": options},
    ):
        r = api.post_as(token, "/activities", {"agentSessionId": "as-ask", **bad})
        assert (r.status_code, r.json()["error"]) == (400, "bad_request"), bad
    assert row_counts(api.pool)["notices"] == before  # nothing written for a bad one
    wait_said(linear, "as-ask", 4)  # "Queued for", "Picked up by", the select and the auth
    posted = [a for a in linear.activities() if a["agentSessionId"] == "as-ask" and a.get("signal")]
    assert [(a["signal"], a["signalMetadata"]) for a in posted] == [("select", options), ("auth", link)]


# --- Linear's webhooks, as a workspace really has them ---------------------------------------------


def test_a_body_signed_by_either_webhook_secret_is_accepted(api: Api) -> None:
    api.register(user="user-1")
    for secret in (SECRET, SECOND_SECRET):
        event = agent_session_event(session_id=f"as-{secret[:6]}")
        assert api.webhook(event, secret=secret).json()["status"] == "dispatched"
    before = row_counts(api.pool)
    answers = [
        api.webhook(agent_session_event(session_id="as-forged"), secret=forged)
        for forged in ("", "not-ours", SECRET + SECOND_SECRET, f"{SECRET},{SECOND_SECRET}")
    ]
    assert {(r.status_code, r.json()["error"]) for r in answers} == {(401, "bad_signature")}
    assert row_counts(api.pool) == before


def test_only_our_own_apps_uninstall_disconnects_the_org(api: Api, linear: Linear) -> None:
    def connected() -> bool:
        r = api.http.get("/linear-credentials", headers=api.admin())
        return bool(next(o for o in r.json()["orgs"] if o["orgId"] == "org-a")["connected"])

    r = api.webhook(app_revoked_event(client="someone-elses-app"))
    assert r.json() == {"status": "ignored", "reason": "another_app_revoked"} and connected()
    api.webhook(app_revoked_event(client="our-client-id"))
    assert not connected()


def test_a_personal_api_key_is_sent_raw_and_said_to_act_as_a_person(api: Api, linear: Linear) -> None:
    key = "lin_api_personal_key_for_tests"
    r = api.http.post("/linear-credentials", json={"orgId": "org-b", "accessToken": key}, headers=api.admin())
    assert r.json()["credential"] == "personal_api_key" and "acts as the person" in r.json()["warning"]
    api.register(org="org-b", user="user-1")
    event = agent_session_event(org="org-b", session_id="as-personal")
    api.webhook(event)
    wait_said(linear, "as-personal", 1)
    assert linear.auth[-1] == key  # raw: Linear refuses a personal key sent as a Bearer token
    api.webhook(agent_session_event(org="org-a", session_id="as-oauth"))
    wait_said(linear, "as-oauth", 1)
    assert linear.auth[-1] == "Bearer lin-test"
