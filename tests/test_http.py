"""Every row of the contract, through real HTTP into the real app on a real Postgres."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.helpers.api import Api, agent_session_event, issue_event, now_ms
from tests.helpers.data import row_counts
from tests.helpers.serving import raw_exchange


def rows(api: Api) -> dict[str, int]:
    return row_counts(api.pool)


def status_of(api: Api, sid: str) -> str:
    with api.pool.connection() as conn:
        r = conn.execute("SELECT status FROM dispatch_sessions WHERE id = %s", (sid,)).fetchone()
    assert r is not None
    return str(r["status"])


# --- webhook -------------------------------------------------------------------------------------


def test_assignment_dispatches_to_the_users_orchestrator(api: Api) -> None:
    oid, token = api.register(user="user-1")
    r = api.webhook(issue_event(assignee="user-1"))
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "dispatched" and body["orchestratorId"] == oid
    assert set(body) >= {"sessionId", "queueId", "messageId", "orchestratorId"}
    got = api.post_as(token, "/claim", {}).json()["messages"]
    assert len(got) == 1
    m = got[0]
    assert m["queueId"] == body["queueId"] and m["messageId"] == body["messageId"]
    assert m["sessionId"] == body["sessionId"] and m["orgId"] == "org-a" and m["attempt"] == 1
    assert m["issue"] == {
        "id": "issue-1",
        "identifier": "ENG-42",
        "title": "Fix the flaky test",
        "url": "https://linear.app/acme/issue/issue-1",
        "description": "It fails on Tuesdays.",
    }
    assert set(m) >= {"claimToken", "leaseExpiresAt", "createdAt", "orchestratorId"}


def test_agent_session_created_dispatches_with_agent_session_id(api: Api) -> None:
    _, token = api.register(user="creator-9")
    r = api.webhook(agent_session_event(creator="creator-9", session_id="as-77"))
    assert r.json()["status"] == "dispatched"
    [m] = api.post_as(token, "/claim").json()["messages"]
    assert m["agentSessionId"] == "as-77" and m["issue"]["identifier"] == "ENG-7"


def test_bad_signature_writes_nothing(api: Api) -> None:
    api.register()
    before = rows(api)
    r = api.webhook(issue_event(), secret="wrong")
    assert r.status_code == 401 and r.json()["error"] == "bad_signature"
    assert r.json()["detail"] == "Linear-Signature does not match the body"
    r = api.http.post("/webhook", content=b"{}", headers={"Linear-Delivery": "x"})
    assert r.status_code == 401 and r.json()["error"] == "bad_signature"
    assert r.json()["detail"].startswith("the Linear-Signature header is missing")  # not "does not match"
    assert rows(api) == before


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1,2]",
        b'{"type":"Issue"}',
        json.dumps({"type": "Issue", "action": "create", "webhookTimestamp": "soon", "data": {}}).encode(),
        json.dumps({"type": "Issue", "action": "create", "webhookTimestamp": 1, "data": []}).encode(),
        json.dumps(
            {"type": "AgentSessionEvent", "action": "created", "webhookTimestamp": 1, "data": {}}
        ).encode(),
    ],
)
def test_malformed_webhook_is_400_and_writes_nothing(api: Api, payload: bytes) -> None:
    api.register()
    before = rows(api)
    r = api.webhook({}, raw=payload)
    assert r.status_code == 400 and r.json()["error"] == "bad_request", r.text
    assert rows(api) == before


def test_stale_webhook_is_401(api: Api) -> None:
    api.register()
    before = rows(api)
    r = api.webhook(issue_event(ts=now_ms() - 61_000))
    assert r.status_code == 401 and r.json()["error"] == "stale_webhook"
    r = api.webhook(issue_event(ts=now_ms() + 61_000))
    assert r.status_code == 401
    assert rows(api) == before


def test_redelivery_is_a_duplicate(api: Api) -> None:
    """A redelivery answers with the session its own first delivery created, not another's."""
    api.register()
    event, other = issue_event(issue_id="iss-a"), issue_event(issue_id="iss-b")
    first = api.webhook(event, delivery="d-1").json()
    second = api.webhook(other, delivery="d-2").json()
    assert first["sessionId"] != second["sessionId"]
    for body, delivery, session in ((other, "d-2", second), (event, "d-1", first)):
        again = api.webhook(body, delivery=delivery)
        assert again.status_code == 200
        assert again.json() == {"status": "duplicate", "sessionId": session["sessionId"]}
    assert rows(api)["sessions"] == 2


def test_the_delivery_header_alone_identifies_a_redelivery(api: Api) -> None:
    """A delivery is known by its Linear-Delivery id as well as by its content: a body that differs
    (here its `updatedAt`) under an id already seen is still that delivery, recorded once."""
    api.register()
    event = issue_event()
    first = api.webhook(event, delivery="d-header").json()
    event["data"]["updatedAt"] = "2026-12-02T11:11:11.000Z"
    again = api.webhook(event, delivery="d-header").json()
    assert again == {"status": "duplicate", "sessionId": first["sessionId"]}
    assert rows(api)["sessions"] == 1


def test_without_delivery_header_the_change_identifies_the_delivery(api: Api) -> None:
    api.register()
    event = issue_event()
    assert api.webhook(event, delivery=None).json()["status"] == "dispatched"
    assert api.webhook(event, delivery=None).json()["status"] == "duplicate"
    event["data"]["updatedAt"] = "2999-12-02T11:11:11.000Z"  # (a later change of the issue)
    assert api.webhook(event, delivery=None).json()["status"] == "dispatched"


def test_concurrent_duplicate_deliveries_create_one_session(api: Api) -> None:
    api.register()
    event = issue_event()
    with ThreadPoolExecutor(16) as ex:
        answers = list(ex.map(lambda _: api.webhook(event, delivery="same-delivery").json(), range(16)))
    statuses = sorted(a["status"] for a in answers)
    assert statuses.count("dispatched") == 1 and statuses.count("duplicate") == 15
    assert len({a["sessionId"] for a in answers}) == 1
    assert rows(api)["sessions"] == 1 and rows(api)["queue"] == 1


def test_no_orchestrator_is_ignored_and_records_only_the_delivery(api: Api) -> None:
    api.register(user="someone-else")
    event = issue_event(assignee="nobody-registered")
    r = api.webhook(event, delivery="d-nobody")
    assert r.json() == {"status": "ignored", "reason": "no_orchestrator"}
    assert rows(api)["sessions"] == 0 and rows(api)["deliveries"] == 1
    # Its redelivery is a duplicate of a delivery that made no session: sessionId null, not "None".
    assert api.webhook(event, delivery="d-nobody").json() == {"status": "duplicate", "sessionId": None}


@pytest.mark.parametrize(
    "event",
    [
        issue_event("create", assignee=None),
        issue_event("update", updated_from={"title": "old"}),
        {
            "type": "Comment",
            "action": "create",
            "organizationId": "org-a",
            "webhookTimestamp": 0,
            "data": {"id": "c"},
        },
    ],
)
def test_other_events_are_ignored(api: Api, event: dict[str, Any]) -> None:
    api.register()
    event["webhookTimestamp"] = now_ms()
    body = api.webhook(event).json()
    assert body["status"] == "ignored" and body["reason"]
    assert rows(api)["sessions"] == 0


def test_reassignment_cancels_and_redispatches(api: Api) -> None:
    _, tok1 = api.register(user="user-1", name="one")
    oid2, tok2 = api.register(user="user-2", name="two")
    first = api.webhook(issue_event(assignee="user-1")).json()
    [m] = api.post_as(tok1, "/claim").json()["messages"]  # claimed, not yet acked
    r = api.webhook(issue_event("update", assignee="user-2", updated_from={"assigneeId": "user-1"})).json()
    assert r["status"] == "dispatched" and r["orchestratorId"] == oid2
    assert r["cancelledSessionId"] == first["sessionId"]
    assert status_of(api, first["sessionId"]) == "cancelled"
    late = api.post_as(tok1, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    assert late.status_code == 404 and late.json()["error"] == "not_found"
    assert len(api.post_as(tok2, "/claim").json()["messages"]) == 1


def test_a_retried_assignment_never_undoes_a_later_change_of_the_issue(api: Api) -> None:
    """Linear retries a delivery that failed a minute later (and the service answers 503, writing
    nothing, precisely so that Linear does). Meanwhile the issue changed again: re-assigned to
    user-2, unassigned, or removed. The retry of the older assignment to user-1 must do nothing:
    not cancel user-2's start and give the issue to user-1's machine, not start work nobody is
    assigned or on an issue that is gone."""
    _, one = api.register(user="user-1", name="one")
    _, two = api.register(user="user-2", name="two")
    for issue_id, later in (("i-re", "user-2"), ("i-un", None)):
        failed = issue_event(issue_id=issue_id, assignee="user-1")  # (its first delivery failed)
        changed = api.webhook(
            issue_event("update", issue_id=issue_id, assignee=later, updated_from={"assigneeId": "user-1"})
        ).json()
        assert changed["status"] == ("dispatched" if later else "ignored"), changed
        retried = api.webhook(failed).json()
        assert retried == {"status": "ignored", "reason": "assignment_superseded"}
        assert api.post_as(one, "/claim", {"max": 10}).json()["messages"] == []
    [start] = api.post_as(two, "/claim", {"max": 10}).json()["messages"]  # user-2's stands
    assert start["issue"]["id"] == "i-re"
    # Removed, then the retry: nothing; restored and assigned again later: dispatched.
    failed = issue_event(issue_id="i-rm", assignee="user-1")
    assert api.webhook(issue_event("remove", issue_id="i-rm")).json()["reason"] == "nothing_to_cancel"
    assert api.webhook(failed).json() == {"status": "ignored", "reason": "assignment_superseded"}
    assert api.post_as(one, "/claim", {"max": 10}).json()["messages"] == []
    again = api.webhook(issue_event(issue_id="i-rm", assignee="user-1")).json()
    assert again["status"] == "dispatched"
    # And a removal whose delivery failed, retried after the issue was restored and assigned
    # again, cancels nothing.
    late_removal = issue_event("remove", issue_id="i-back")
    back = api.webhook(issue_event(issue_id="i-back", assignee="user-1")).json()
    assert api.webhook(late_removal).json() == {"status": "ignored", "reason": "assignment_superseded"}
    assert status_of(api, back["sessionId"]) == "queued"
    # In order, the same events do what they say: a later assignment takes the issue back.
    back = api.webhook(
        issue_event("update", issue_id="i-re", assignee="user-1", updated_from={"assigneeId": "user-2"})
    )
    assert back.json()["status"] == "dispatched"


def test_a_retried_reassignment_after_a_later_change_is_recorded_as_ignored(api: Api) -> None:
    """A re-assignment to someone with a machine, retried after a later change of the issue, does
    nothing, and its delivery's record says so (`ignored`, as every delivery that does nothing), so
    a retry after that is a duplicate of it."""
    api.register(user="user-1", name="one")
    _, two = api.register(user="user-2", name="two")
    first = api.webhook(issue_event(issue_id="i-late", assignee="user-1")).json()
    assert first["status"] == "dispatched"
    failed = issue_event(
        "update", issue_id="i-late", assignee="user-2", updated_from={"assigneeId": "user-1"}
    )
    unassigned = issue_event(
        "update", issue_id="i-late", assignee=None, updated_from={"assigneeId": "user-1"}
    )
    assert api.webhook(unassigned).json()["status"] == "cancelled"
    retried = api.webhook(failed, "d-late").json()
    assert retried == {"status": "ignored", "reason": "assignment_superseded"}
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT outcome FROM webhook_deliveries WHERE delivery_key = 'delivery:d-late'"
        ).fetchone()
    assert row == {"outcome": "ignored"}
    assert api.post_as(two, "/claim", {"max": 10}).json()["messages"] == []
    assert api.webhook(failed, "d-late").json()["status"] == "duplicate"


def test_an_unreadable_updated_at_orders_nothing_and_is_not_an_error(api: Api) -> None:
    """`updatedAt` that is not a time (or is missing) leaves the event unordered: it is handled as it
    comes, never answered 4xx or 5xx for it."""
    api.register(user="user-1")
    odd = ["not a time", 12, None, "2026-12-07T10:00:00", "9" * 100, "0001-01-01T00:00:00+01:00"]
    odd += ["2026-12-07T10:00:00+16:00", "2026-12-07T10:00:00+05:30:15.5"]  # (zones Postgres refuses)
    for n, value in enumerate(odd):
        event = issue_event(issue_id=f"i-odd-{n}", assignee="user-1")
        event["data"]["updatedAt"] = value
        r = api.webhook(event)
        assert r.status_code == 200 and r.json()["status"] == "dispatched", (value, r.text)


def test_unassignment_and_removal_cancel(api: Api) -> None:
    api.register(user="user-1")
    a = api.webhook(issue_event(assignee="user-1", issue_id="i-a")).json()
    r = api.webhook(
        issue_event("update", issue_id="i-a", assignee=None, updated_from={"assigneeId": "user-1"})
    )
    assert r.json() == {"status": "cancelled", "sessionId": a["sessionId"]}
    b = api.webhook(issue_event(assignee="user-1", issue_id="i-b")).json()
    r = api.webhook(issue_event("remove", issue_id="i-b"))
    assert r.json() == {"status": "cancelled", "sessionId": b["sessionId"]}
    assert rows(api)["queue"] == 0
    # Nothing left to cancel: ignored, saying why, and not "no_orchestrator" (the contract keeps
    # that reason for an assignment to a user without a machine).
    for event in (
        issue_event("remove", issue_id="i-b"),
        issue_event("update", issue_id="i-never", assignee=None, updated_from={"assigneeId": "user-1"}),
    ):
        answer = api.webhook(event).json()
        assert answer["status"] == "ignored" and answer["reason"] not in ("", None, "no_orchestrator")


def test_too_large_body_is_413(api: Api) -> None:
    big = b"{" + b" " * (1024 * 1024 + 10) + b"}"
    r = api.http.post("/webhook", content=big, headers={"Linear-Signature": "00"})
    assert r.status_code == 413 and r.json()["error"] == "too_large"


def test_a_body_shorter_than_its_content_length_is_refused_and_writes_nothing(api: Api) -> None:
    # A client that declares more than it sends and hangs up: the part that arrived is complete,
    # valid JSON, and still not taken as the request.
    body = json.dumps({"orgId": "org-a", "linearUserId": "user-1", "name": "half"}).encode()
    head = (
        f"POST /orchestrators HTTP/1.1\r\nHost: x\r\nAuthorization: {api.admin()['Authorization']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body) + 20}"
    )
    status, payload = raw_exchange(api.url, head, body, end_early=True)
    assert status == 400, payload
    assert json.loads(payload)["error"] == "bad_request"
    assert api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"] == []


def test_every_answer_forbids_framing_once(api: Api) -> None:
    # JSON answers, errors of every kind, and pages that set their own policy (the dashboard's).
    answers = {
        "healthz": api.http.get("/healthz"),
        "claim without a token": api.http.post("/claim", json={}),
        "no such path": api.http.get("/nowhere"),
        "wrong method": api.http.get("/claim"),
        "bad body": api.http.post("/orchestrators", content=b"[", headers=api.admin()),
        "dashboard page": api.http.get("/dashboard/login"),
    }
    for what, r in answers.items():
        assert r.headers.get_list("x-frame-options") == ["DENY"], what
        policies = r.headers.get_list("content-security-policy")
        assert len(policies) == 1 and "frame-ancestors 'none'" in policies[0], (what, policies)
    assert answers["dashboard page"].headers["content-security-policy"] != "frame-ancestors 'none'"


# --- orchestrators -------------------------------------------------------------------------------


def test_register_list_revoke(api: Api) -> None:
    oid, token = api.register()
    assert token.startswith("dpo_") and len(token) > 40
    listed = api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]
    assert [o["orchestratorId"] for o in listed] == [oid]
    assert "token" not in listed[0] and token not in json.dumps(listed)
    with api.pool.connection() as conn:
        stored = conn.execute("SELECT token_hash FROM orchestrators").fetchone()
    assert stored is not None and token.encode() not in bytes(stored["token_hash"])
    assert api.post_as(token, "/claim").status_code == 200
    r = api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin())
    assert r.status_code == 200
    r = api.post_as(token, "/claim")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert api.http.post(f"/orchestrators/{uuid.uuid4()}/revoke", headers=api.admin()).status_code == 404


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}])
def test_admin_routes_need_the_admin_token(api: Api, headers: dict[str, str]) -> None:
    for method, path in [
        ("POST", "/orchestrators"),
        ("GET", "/orchestrators"),
        ("POST", "/sweep"),
        ("POST", f"/orchestrators/{uuid.uuid4()}/revoke"),
    ]:
        r = api.http.request(
            method, path, headers=headers, json={"orgId": "o", "linearUserId": "u", "name": "n"}
        )
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (method, path)
    assert rows(api)["orchestrators"] == 0


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"orgId": "o"},
        {"orgId": 1, "linearUserId": "u", "name": "n"},
        {"orgId": " ", "linearUserId": "u", "name": "n"},
    ],
)
def test_register_validates(api: Api, body: dict[str, Any]) -> None:
    r = api.http.post("/orchestrators", json=body, headers=api.admin())
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    assert rows(api)["orchestrators"] == 0


# --- claim / ack / release -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [{"max": 0}, {"max": 101}, {"max": "5"}, {"waitSeconds": 26}, {"waitSeconds": -1}, {"max": 1.5}, [1]],
)
def test_claim_validates(api: Api, body: Any) -> None:
    _, token = api.register()
    r = api.post_as(token, "/claim", body)
    assert r.status_code == 400 and r.json()["error"] == "bad_request", r.text


def test_claim_respects_max_and_orders_oldest_first(api: Api) -> None:
    _, token = api.register()
    queued = [api.webhook(issue_event(issue_id=f"i{n}")).json()["queueId"] for n in range(4)]
    a = api.post_as(token, "/claim", {"max": 3}).json()["messages"]
    b = api.post_as(token, "/claim", {"max": 3}).json()["messages"]
    assert [m["queueId"] for m in a + b] == queued


def test_ack_contract(api: Api) -> None:
    _, token = api.register(user="user-1")
    _, other = api.register(user="user-2")
    sid = api.webhook(issue_event()).json()["sessionId"]
    [m] = api.post_as(token, "/claim").json()["messages"]
    body = {"queueId": m["queueId"], "claimToken": m["claimToken"]}
    r = api.post_as(other, "/ack", body)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": str(uuid.uuid4())})
    assert r.status_code == 409 and r.json()["error"] == "claim_superseded"
    assert api.post_as(token, "/ack", body).json() == {"status": "acked"}
    assert api.post_as(token, "/ack", body).json() == {"status": "acked"}
    assert status_of(api, sid) == "delivered" and rows(api)["queue"] == 0
    r = api.post_as(token, "/ack", {"queueId": str(uuid.uuid4()), "claimToken": m["claimToken"]})
    assert r.status_code == 404
    r = api.post_as(token, "/ack", {"queueId": "not-a-uuid", "claimToken": m["claimToken"]})
    assert r.status_code == 404
    for bad in [{}, {"queueId": 5, "claimToken": "x"}, {"acks": []}, {"acks": [{"queueId": "x"}]}]:
        r = api.post_as(token, "/ack", bad)
        assert r.status_code == 400, bad


def test_an_ack_says_what_is_wrong_with_its_claim_token(api: Api) -> None:
    """A token the service never issued is not called superseded by a newer claim: only the latest
    claim's token is kept, so the service says what it knows."""
    _, token = api.register()
    queue_id = api.webhook(issue_event()).json()["queueId"]
    made_up = str(uuid.uuid4())
    r = api.post_as(token, "/ack", {"queueId": queue_id, "claimToken": made_up})  # nothing claimed it yet
    assert r.status_code == 409 and r.json()["error"] == "claim_superseded"
    assert r.json()["detail"].startswith("nothing has claimed this row yet, so no claim token was issued")
    [m] = api.post_as(token, "/claim").json()["messages"]
    r = api.post_as(token, "/ack", {"queueId": queue_id, "claimToken": made_up})
    assert r.status_code == 409 and r.json()["error"] == "claim_superseded"
    detail = r.json()["detail"]
    assert "not the row's latest claim's" in detail and "never issued" in detail
    assert "newer claim owns" not in detail
    assert api.post_as(token, "/ack", {"queueId": queue_id, "claimToken": m["claimToken"]}).status_code == 200
    r = api.post_as(token, "/ack", {"queueId": queue_id, "claimToken": made_up})
    assert r.status_code == 409 and r.json()["detail"].startswith(
        "this row was delivered, acked with another"
    )


def test_batch_ack(api: Api) -> None:
    _, token = api.register()
    for n in range(3):
        api.webhook(issue_event(issue_id=f"i{n}"))
    ms = api.post_as(token, "/claim").json()["messages"]
    missing = str(uuid.uuid4())
    r = api.post_as(
        token,
        "/ack",
        {
            "acks": [
                {"queueId": ms[0]["queueId"], "claimToken": ms[0]["claimToken"]},
                {"queueId": ms[1]["queueId"], "claimToken": str(uuid.uuid4())},
                {"queueId": missing, "claimToken": ms[2]["claimToken"]},
            ]
        },
    )
    assert r.status_code == 200
    assert r.json()["results"] == [
        {"queueId": ms[0]["queueId"], "status": "acked"},
        {"queueId": ms[1]["queueId"], "error": "claim_superseded"},
        {"queueId": missing, "error": "not_found"},
    ]


@pytest.mark.parametrize(
    "api_overrides",
    [
        {
            "DEVPILOT_LEASE_SECONDS": 1,
            "DEVPILOT_BACKOFF_BASE_SECONDS": 1,
            "DEVPILOT_BACKOFF_CAP_SECONDS": 2,
            "DEVPILOT_MAX_ATTEMPTS": 3,
        }
    ],
)
def test_lease_expiry_backoff_and_dead_letter_over_http(api: Api) -> None:
    _, token = api.register()
    sid = api.webhook(issue_event()).json()["sessionId"]
    tokens = []
    for attempt in (1, 2, 3):
        deadline = time.monotonic() + 15
        got: list[Any] = []
        while not got and time.monotonic() < deadline:
            got = api.post_as(token, "/claim").json()["messages"]
            if not got:
                api.http.post("/sweep", headers=api.admin())
                time.sleep(0.2)
        assert [m["attempt"] for m in got] == [attempt]
        tokens.append(got[0])
        time.sleep(1.1)  # let the lease lapse
        sw = api.http.post("/sweep", headers=api.admin()).json()
        assert sw == (
            {"requeued": 1, "deadLettered": 0} if attempt < 3 else {"requeued": 0, "deadLettered": 1}
        )
    assert status_of(api, sid) == "failed"
    assert len({m["messageId"] for m in tokens}) == 1
    assert len({m["claimToken"] for m in tokens}) == 3


@pytest.mark.parametrize("api_overrides", [{"DEVPILOT_LEASE_SECONDS": 1}])
def test_late_ack_of_latest_claim_after_requeue(api: Api) -> None:
    _, token = api.register()
    sid = api.webhook(issue_event()).json()["sessionId"]
    [m] = api.post_as(token, "/claim").json()["messages"]
    time.sleep(1.2)
    assert api.http.post("/sweep", headers=api.admin()).json()["requeued"] == 1
    r = api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    assert r.json() == {"status": "acked"} and status_of(api, sid) == "delivered"


def test_release(api: Api) -> None:
    _, token = api.register()
    api.webhook(issue_event())
    [m] = api.post_as(token, "/claim").json()["messages"]
    r = api.post_as(
        token, "/release", {"queueId": m["queueId"], "claimToken": m["claimToken"], "reason": "busy"}
    )
    assert r.status_code == 200 and r.json()["status"] == "released" and r.json()["availableAt"]
    assert api.post_as(token, "/claim").json()["messages"] == []  # backing off for 60 s
    r = api.post_as(token, "/release", {"queueId": m["queueId"], "claimToken": str(uuid.uuid4())})
    assert r.status_code == 409
    r = api.post_as(token, "/release", {"queueId": str(uuid.uuid4()), "claimToken": m["claimToken"]})
    assert r.status_code == 404
    assert api.post_as(token, "/release", {"queueId": m["queueId"]}).status_code == 400


def test_many_concurrent_http_claimers_get_each_row_once(api: Api) -> None:
    _, token = api.register()
    queued = {api.webhook(issue_event(issue_id=f"i{n}")).json()["queueId"] for n in range(150)}
    got: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(base_url=api.url, timeout=30) as c:
            while True:
                r = c.post("/claim", json={"max": 3}, headers={"Authorization": f"Bearer {token}"})
                ms = r.json()["messages"]
                if not ms:
                    return
                with lock:
                    got.extend(m["queueId"] for m in ms)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(queued) and set(got) == queued


def test_long_poll_returns_when_work_arrives(api: Api) -> None:
    _, token = api.register()
    result: dict[str, Any] = {}

    def wait() -> None:
        t = time.monotonic()
        r = api.post_as(token, "/claim", {"waitSeconds": 20})
        result["elapsed"] = time.monotonic() - t
        result["messages"] = r.json()["messages"]

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.8)
    qid = api.webhook(issue_event()).json()["queueId"]
    th.join(timeout=25)
    assert [m["queueId"] for m in result["messages"]] == [qid]
    assert result["elapsed"] < 10  # woken, not timed out (latency itself is measured in bench/)


def test_long_poll_returns_empty_when_the_wait_ends(api: Api) -> None:
    _, token = api.register()
    t = time.monotonic()
    r = api.post_as(token, "/claim", {"waitSeconds": 1})
    assert r.json() == {"messages": []} and 0.9 < time.monotonic() - t < 5


def test_cross_org_isolation(api: Api) -> None:
    _, tok_a = api.register(org="org-a", user="shared-user")
    _, tok_b = api.register(org="org-b", user="shared-user")
    a = api.webhook(issue_event(org="org-a", assignee="shared-user")).json()
    assert api.post_as(tok_b, "/claim").json()["messages"] == []
    r = api.post_as(tok_b, "/ack", {"queueId": a["queueId"], "claimToken": str(uuid.uuid4())})
    assert r.status_code == 404
    [ma] = api.post_as(tok_a, "/claim").json()["messages"]
    assert ma["orgId"] == "org-a"
    r = api.post_as(tok_b, "/ack", {"queueId": ma["queueId"], "claimToken": ma["claimToken"]})
    assert r.status_code == 404
    r = api.post_as(tok_b, "/release", {"queueId": ma["queueId"], "claimToken": ma["claimToken"]})
    assert r.status_code == 404


def test_orchestrator_routes_reject_bad_tokens(api: Api) -> None:
    api.register()
    for path in ["/claim", "/ack", "/release", "/realtime-token", "/machine"]:
        for headers in [{}, {"Authorization": "Bearer wrong"}, api.admin()]:
            r = api.http.post(path, json={}, headers=headers)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, headers)


# --- misc ----------------------------------------------------------------------------------------


def test_healthz_and_unknown_routes(api: Api) -> None:
    assert api.http.get("/healthz").json() == {"ok": True}
    r = api.http.get("/nope")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = api.http.get("/claim")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"


def test_realtime_disabled_without_supabase(api: Api) -> None:
    _, token = api.register()
    r = api.post_as(token, "/realtime-token")
    assert r.status_code == 404 and r.json()["error"] == "realtime_disabled"


@pytest.mark.parametrize(
    "api_overrides",
    [{"SUPABASE_URL": "https://x.supabase.co", "SUPABASE_ANON_KEY": "anon", "SUPABASE_JWT_SECRET": "s" * 40}],
)
def test_realtime_token_hs256(api: Api) -> None:
    import jwt

    oid, token = api.register()
    body = api.post_as(token, "/realtime-token").json()
    assert body["table"] == "dispatch_queue" and body["filter"] == f"orchestrator_id=eq.{oid}"
    assert body["supabaseUrl"] == "https://x.supabase.co" and body["expiresAt"]
    claims = jwt.decode(body["token"], "s" * 40, algorithms=["HS256"], audience="authenticated")
    assert claims["role"] == "authenticated" and claims["orchestrator_id"] == oid
    assert claims["exp"] - claims["iat"] <= 3600


@pytest.mark.parametrize("api_overrides", [{"DEVPILOT_SWEEP_PLATFORM_AUTH": True}])
def test_sweep_behind_platform_auth_needs_no_admin_token(api: Api) -> None:
    """Cloud Run's sweep service: the platform verified the scheduler's OIDC token already."""
    assert api.http.post("/sweep").json() == {"requeued": 0, "deadLettered": 0}
    assert api.http.post("/orchestrators", json={}).status_code == 401  # only the sweep trusts the platform


def test_routing_prefers_the_most_recently_seen_machine(api: Api) -> None:
    a_id, a = api.register(user="same-user", name="old-laptop")
    b_id, b = api.register(user="same-user", name="new-desktop")
    api.post_as(a, "/claim")
    assert api.webhook(issue_event(issue_id="r1", assignee="same-user")).json()["orchestratorId"] == a_id
    time.sleep(0.05)
    api.post_as(b, "/claim")
    assert api.webhook(issue_event(issue_id="r2", assignee="same-user")).json()["orchestratorId"] == b_id
    api.http.post(f"/orchestrators/{b_id}/revoke", headers=api.admin())
    assert api.webhook(issue_event(issue_id="r3", assignee="same-user")).json()["orchestratorId"] == a_id
