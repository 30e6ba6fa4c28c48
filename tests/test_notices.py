"""Telling Linear what happened, against a local HTTP server standing in for Linear's GraphQL API
(pytest-httpserver): the exact mutations and variables, the 10 s path, retries, and a crash between
commit and send."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from shared.delivery import intake
from shared.linear import webhooks as linear
from tests.helpers.api import Api, agent_session_event, issue_event, now_ms
from tests.helpers.data import row_counts, write_notice
from tests.helpers.linear import Linear, linear_settings

TOKEN = "lin_app_token_for_tests"


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return linear_settings(httpserver, DEVPILOT_MAX_ATTEMPTS=3)


def store_token(api: Api, org: str = "org-a") -> None:
    r = api.http.post("/linear-credentials", json={"orgId": org, "accessToken": TOKEN}, headers=api.admin())
    assert r.status_code == 200 and r.json() == {"orgId": org, "stored": True, "credential": "access_token"}


def notices(api: Api) -> list[dict[str, Any]]:
    with api.pool.connection() as conn:
        return [dict(r) for r in conn.execute("SELECT * FROM linear_notices ORDER BY seq")]


def test_agent_session_hears_back_within_seconds(api: Api, httpserver: HTTPServer) -> None:
    stand_in = Linear(httpserver)
    store_token(api)
    _, token = api.register(user="creator-1", name="alice-laptop")
    t0 = time.monotonic()
    r = api.webhook(agent_session_event(creator="creator-1", session_id="as-9"))
    assert r.json()["status"] == "dispatched"
    stand_in.wait(1)
    assert time.monotonic() - t0 < 10  # Linear's budget for the first activity
    first = notices(api)[0]
    assert stand_in.calls[0]["variables"] == {
        "input": {
            "id": str(first["id"]),  # Linear's idempotency id: a retried post never shows twice
            "agentSessionId": "as-9",
            "content": {"type": "thought", "body": "Queued for alice-laptop"},
        }
    }
    assert "mutation AgentActivityCreate" in stand_in.calls[0]["query"]
    assert stand_in.auth == [f"Bearer {TOKEN}"]
    [m] = api.post_as(token, "/claim").json()["messages"]
    api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    stand_in.wait(2)
    assert stand_in.calls[1]["variables"]["input"] == {
        "id": str(notices(api)[1]["id"]),
        "agentSessionId": "as-9",
        "content": {"type": "thought", "body": "Picked up by alice-laptop"},
    }
    deadline = time.monotonic() + 10  # marked sent after Linear answered: wait for that commit
    while time.monotonic() < deadline and not all(n["sent_at"] for n in notices(api)):
        time.sleep(0.02)
    sent = notices(api)
    # (and, since the start was delivered, the issue's move to started: `test_linear_informed.py`)
    assert [n["kind"] for n in sent] == ["dispatched", "delivered", "issue_started"]
    assert all(n["sent_at"] is not None for n in sent) and [n["linear_id"] for n in sent][:2] == [
        "act-1",
        "act-2",
    ]


def test_retry_after_linear_fails_and_at_most_once_after_success(api: Api, httpserver: HTTPServer) -> None:
    stand_in = Linear(httpserver, fail=1)
    store_token(api)
    api.register(user="creator-1")
    api.webhook(agent_session_event(creator="creator-1"))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (notices(api) and notices(api)[0]["last_error"]):
        time.sleep(0.05)
    [n] = notices(api)
    assert n["sent_at"] is None and n["attempts"] == 1 and "500" in n["last_error"]
    time.sleep(1.1)  # backoff 1² × 1 s
    api.http.post("/sweep", headers=api.admin())
    [n] = notices(api)
    assert n["sent_at"] is not None and n["linear_id"] == "act-1"
    api.http.post("/sweep", headers=api.admin())
    assert len(stand_in.calls) == 1  # sent once, never again


def test_a_crash_between_commit_and_send_loses_nothing(api: Api, httpserver: HTTPServer) -> None:
    stand_in = Linear(httpserver)
    store_token(api)
    api.register(user="creator-1")
    # the library path commits the notice with the dispatch, but nobody sends it: as if the
    # instance died right after the commit
    body = json.dumps(agent_session_event(creator="creator-1", session_id="as-crash")).encode()
    received = intake.receive(api.pool, linear.parse(body), "crash-delivery")
    answer, ids = received.answer, received.notice_ids
    assert answer["status"] == "dispatched" and len(ids) == 1
    time.sleep(0.3)
    assert stand_in.calls == []
    api.http.post("/sweep", headers=api.admin())
    assert stand_in.calls[0]["variables"]["input"]["agentSessionId"] == "as-crash"


def test_dead_letter_gets_a_comment_and_unroutable_plain_assignments_nothing(
    api: Api, httpserver: HTTPServer
) -> None:
    """A dead-lettered assignment is a comment on the issue. An assignment to someone without a
    machine posts nothing (most assignments in a workspace are not for agents); an agent session
    that nothing can take gets an `error` activity at once, so Linear does not wait on it. A plain
    assignment that is dispatched writes nothing for Linear either (no agent session to speak in)."""
    stand_in = Linear(httpserver)
    store_token(api)
    _, token = api.register(user="user-1")
    api.webhook(issue_event(issue_id="iss-dead", assignee="user-1"))
    assert row_counts(api.pool)["notices"] == 0
    [m] = api.post_as(token, "/claim").json()["messages"]
    with api.pool.connection() as conn:
        conn.execute("UPDATE dispatch_queue SET attempts = 3 WHERE id = %s", (m["queueId"],))
    r = api.post_as(
        token, "/release", {"queueId": m["queueId"], "claimToken": m["claimToken"], "reason": "no disk"}
    )
    assert r.json()["deadLettered"] is True
    stand_in.wait(1)
    assert "mutation CommentCreate" in stand_in.calls[0]["query"]
    assert stand_in.calls[0]["variables"]["input"]["issueId"] == "iss-dead"
    assert "no disk" in stand_in.calls[0]["variables"]["input"]["body"]
    assert (
        api.webhook(issue_event(issue_id="iss-nobody", assignee="nobody")).json()["reason"]
        == "no_orchestrator"
    )
    r = api.webhook(agent_session_event(creator="nobody", session_id="as-nobody"))
    assert r.json() == {"status": "ignored", "reason": "no_orchestrator"}
    stand_in.wait(2)
    time.sleep(0.3)
    assert len(stand_in.calls) == 2  # the dead letter's comment and the agent session's error only
    activity = stand_in.calls[1]["variables"]["input"]
    assert activity["agentSessionId"] == "as-nobody" and activity["content"]["type"] == "error"
    assert "No machine is registered" in activity["content"]["body"]


def test_events_the_service_ignores_post_nothing_in_a_connected_org(api: Api, httpserver: HTTPServer) -> None:
    """Most of a workspace's webhook traffic is not for us (issues created unassigned, edits that
    leave the assignee alone, comments, agent-session actions we do not handle). In an org Linear
    hears from, with a machine registered, each is ignored and writes nothing for Linear: no
    notice, no post."""
    stand_in = Linear(httpserver)
    store_token(api)
    api.register(user="user-1")
    events: list[dict[str, Any]] = [
        issue_event(issue_id="iss-unassigned", assignee=None),
        issue_event("update", issue_id="iss-edited", updated_from={"title": "Old title"}),
        {
            "type": "Comment",
            "action": "create",
            "organizationId": "org-a",
            "webhookTimestamp": now_ms(),
            "data": {"id": "comment-1", "body": "looks good", "issueId": "iss-edited"},
        },
        agent_session_event(session_id="as-other-action", action="updated"),
    ]
    for event in events:
        r = api.webhook(event)
        assert r.status_code == 200 and r.json()["status"] == "ignored", (event["type"], r.text)
        assert r.json()["reason"], r.text  # ignored answers say why
    time.sleep(0.3)
    counts = row_counts(api.pool)
    assert (counts["notices"], counts["sessions"], counts["queue"]) == (0, 0, 0)
    assert stand_in.calls == []


def test_sending_named_notices_sends_only_those(api: Api, httpserver: HTTPServer) -> None:
    """After a commit a request sends the notices it wrote, by id (or follows their agent sessions);
    other orgs' or sessions' due notices are left to the sweep, not posted from this request."""
    from shared.linear import notices as outbox

    stand_in = Linear(httpserver)
    store_token(api)
    mine, other = (
        write_notice(api.pool, "org-a", "as-mine", "mine"),
        write_notice(api.pool, "org-a", "as-other", "other"),
    )
    assert outbox.send_pending(api.pool, api.settings, ids=[mine]).sent == 1
    assert [c["variables"]["input"]["id"] for c in stand_in.calls] == [str(mine)]
    assert {str(n["id"]): n["sent_at"] is not None for n in notices(api)} == {
        str(mine): True,
        str(other): False,
    }
    assert outbox.send_pending(api.pool, api.settings).sent == 1  # the sweep's round: any due one


def test_a_disconnected_orgs_posts_wait_while_others_go(api: Api, httpserver: HTTPServer) -> None:
    from shared.linear import notices as outbox

    stand_in = Linear(httpserver)
    store_token(api, "org-a")
    store_token(api, "org-b")
    going, waiting = (
        write_notice(api.pool, "org-a", "as-a", "a"),
        write_notice(api.pool, "org-b", "as-b", "b"),
    )
    with api.pool.connection() as conn:
        conn.execute("UPDATE linear_credentials SET disconnected_at = now() WHERE org_id = 'org-b'")
    assert outbox.send_pending(api.pool, api.settings).sent == 1
    assert [c["variables"]["input"]["id"] for c in stand_in.calls] == [str(going)]
    [held] = [n for n in notices(api) if n["id"] == waiting]
    assert held["sent_at"] is None and held["attempts"] == 0  # waits for a new install, untouched


def test_a_failed_post_backs_off_itself_and_no_other(api: Api, httpserver: HTTPServer) -> None:
    from shared.linear import notices as outbox

    Linear(httpserver, fail=1)
    store_token(api, "org-a")
    store_token(api, "org-b")
    failing, bystander = (
        write_notice(api.pool, "org-a", "as-a", "a"),
        write_notice(api.pool, "org-b", "as-b", "b"),
    )
    with api.pool.connection() as conn:  # org-b's post is not taken this round
        conn.execute("UPDATE linear_credentials SET disconnected_at = now() WHERE org_id = 'org-b'")
    before = {n["id"]: n for n in notices(api)}
    assert outbox.send_pending(api.pool, api.settings).failed == 1
    after = {n["id"]: n for n in notices(api)}
    assert (
        "500" in after[failing]["last_error"]
        and after[failing]["available_at"] > before[failing]["available_at"]
    )
    assert after[bystander] == before[bystander]  # untouched: attempts, due time, last error


def test_a_given_up_post_no_longer_holds_its_session_back(api: Api, httpserver: HTTPServer) -> None:
    from shared.linear import notices as outbox

    stand_in = Linear(httpserver)
    store_token(api)
    first, second = (
        write_notice(api.pool, "org-a", "as-1", "first"),
        write_notice(api.pool, "org-a", "as-1", "second"),
    )
    with api.pool.connection() as conn:  # the first is unsent and waiting out a backoff: it holds
        conn.execute(
            "UPDATE linear_notices SET available_at = now() + interval '1 hour' WHERE id = %s", (first,)
        )
    assert outbox.send_pending(api.pool, api.settings).sent == 0
    with api.pool.connection() as conn:  # given up (past the attempt limit): it no longer holds
        conn.execute("UPDATE linear_notices SET available_at = 'infinity' WHERE id = %s", (first,))
    assert outbox.send_pending(api.pool, api.settings).sent == 1
    assert [c["variables"]["input"]["id"] for c in stand_in.calls] == [str(second)]


def test_a_post_being_sent_is_skipped_not_waited_for(api: Api, db_url: str, httpserver: HTTPServer) -> None:
    """Another sender holds one notice (its row lock, mid-take): this sender posts the rest at once,
    never that one, and does not wait for the other's transaction."""
    import threading

    from shared.linear import notices as outbox
    from shared.plumbing.db import connect

    stand_in = Linear(httpserver)
    store_token(api)
    held, free = (
        write_notice(api.pool, "org-a", "as-held", "held"),
        write_notice(api.pool, "org-a", "as-free", "free"),
    )
    with connect(db_url, autocommit=False) as other:
        other.execute("SELECT 1 FROM linear_notices WHERE id = %s FOR UPDATE", (held,))
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(outbox.send_pending(api.pool, api.settings).sent))
        t.start()
        t.join(timeout=10)
        finished = not t.is_alive()
        other.rollback()
    t.join()
    assert finished, "the sender waited on a notice another sender holds"
    assert done == [1] and [c["variables"]["input"]["id"] for c in stand_in.calls] == [str(free)]


def test_no_credentials_no_notices(api: Api, httpserver: HTTPServer) -> None:
    Linear(httpserver)
    _, token = api.register(user="creator-1")
    api.webhook(agent_session_event(creator="creator-1"))
    [m] = api.post_as(token, "/claim").json()["messages"]
    api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    assert notices(api) == []


def test_credentials_are_stored_encrypted_and_never_returned(api: Api) -> None:
    store_token(api, "org-z")
    listed = api.http.get("/linear-credentials", headers=api.admin())
    assert listed.json()["orgs"][0]["orgId"] == "org-z" and TOKEN not in listed.text
    with api.pool.connection() as conn:
        row = conn.execute("SELECT token_encrypted FROM linear_credentials").fetchone()
    assert row is not None and TOKEN.encode() not in bytes(row["token_encrypted"])
    assert api.http.post("/linear-credentials", json={"orgId": "x"}, headers=api.admin()).status_code == 400
    assert api.http.post("/linear-credentials", json={"orgId": "x", "accessToken": "y"}).status_code == 401
    assert api.http.delete("/linear-credentials/org-z", headers=api.admin()).json()["deleted"] is True
    assert api.http.delete("/linear-credentials/org-z", headers=api.admin()).status_code == 404
