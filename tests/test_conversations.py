"""Agent sessions are conversations: start, follow-ups, stop and the agent's own replies, all through
the queue and the outbox, over real HTTP against real Postgres, with a Linear stand-in that checks
every GraphQL document against Linear's published schema."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID, uuid4

import pytest
from pytest_httpserver import HTTPServer

from shared.delivery.queue import AckItem, ack_many, claim
from shared.plumbing.db import Pool
from shared.plumbing.sql import query_with_limit
from shared.wire import agent_tokens
from tests.helpers.api import Api, agent_session_event, issue_event, now_ms
from tests.helpers.data import bulk, row_counts
from tests.helpers.linear import Linear

LINEAR_TOKEN = "lin_app_token_for_conversations"


def ack(api: Api, token: str, m: dict[str, Any]) -> int:
    return api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]}).status_code


def test_created_carries_the_prompt_and_linear_hears_back(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1", name="laptop")
    event = agent_session_event(session_id="as-1", body="@agent fix the flaky test")
    r = api.webhook(event).json()
    assert r["status"] == "dispatched" and r["kind"] == "start"
    [m] = api.claim_all(token)
    assert m["kind"] == "start" and m["agentSessionId"] == "as-1"
    assert m["prompt"]["context"] == event["promptContext"]  # the request, as Linear formats it
    assert m["prompt"]["body"] == "@agent fix the flaky test"  # the comment it was started from
    assert m["prompt"]["guidance"] == event["guidance"] and m["prompt"]["signal"] is None
    assert m["issue"]["id"] == "issue-as"
    linear.wait(1)
    assert linear.activities()[0]["content"]["type"] == "thought"


def test_follow_up_goes_to_the_holder_in_order_never_rerouted(api: Api, linear: Linear) -> None:
    _, first = api.register(user="user-1", name="laptop")
    api.webhook(agent_session_event(session_id="as-2"))
    _, second = api.register(user="user-1", name="desktop")
    assert api.claim_all(second) == []  # now the most recently seen machine of that user
    r = api.webhook(agent_session_event(session_id="as-2", action="prompted", body="also the docs")).json()
    assert r["status"] == "dispatched" and r["kind"] == "prompt"
    assert api.claim_all(second) == []  # never re-routed
    [start] = api.claim_all(first)
    assert start["kind"] == "start"
    assert api.claim_all(first) == []  # the prompt waits while its start is claimed, not acked
    assert ack(api, first, start) == 200
    [prompt] = api.claim_all(first)
    assert prompt["kind"] == "prompt" and prompt["prompt"]["body"] == "also the docs"
    assert prompt["prompt"]["context"] is None


def test_follow_up_with_no_holder_is_routed_as_a_start(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    r = api.webhook(agent_session_event(session_id="as-3", action="prompted", body="hello?")).json()
    assert r["status"] == "dispatched" and r["kind"] == "start"
    [m] = api.claim_all(token)
    assert (m["kind"], m["prompt"]["body"]) == ("start", "hello?")


def test_stop_before_any_delivery_cancels_and_tells_linear(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    started = api.webhook(agent_session_event(session_id="as-4")).json()
    r = api.webhook(agent_session_event(session_id="as-4", action="prompted", signal="stop")).json()
    assert r == {"status": "stopped", "cancelledSessionIds": [started["sessionId"]], "stopSessionId": None}
    assert api.claim_all(token) == []  # the machine never starts it
    linear.wait(2)
    final = linear.activities()[-1]
    assert final["agentSessionId"] == "as-4" and final["content"]["type"] == "response"


def test_stop_after_delivery_cancels_the_rest_and_queues_a_stop(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-5"))
    [start] = api.claim_all(token)
    assert ack(api, token, start) == 200
    follow = api.webhook(agent_session_event(session_id="as-5", action="prompted", body="more")).json()
    r = api.webhook(agent_session_event(session_id="as-5", action="prompted", signal="stop")).json()
    assert r["status"] == "stopped" and r["cancelledSessionIds"] == [follow["sessionId"]]
    [stop] = api.claim_all(token)
    assert stop["kind"] == "stop" and stop["sessionId"] == r["stopSessionId"] and stop["prompt"] is None
    with api.pool.connection() as conn:
        kinds = conn.execute(
            "SELECT kind, status FROM dispatch_sessions WHERE agent_session_id = 'as-5' ORDER BY created_at"
        ).fetchall()
    assert [(k["kind"], k["status"]) for k in kinds] == [
        ("start", "delivered"),
        ("prompt", "cancelled"),
        ("stop", "queued"),
    ]


@pytest.mark.parametrize("issue_in_event", [True, False], ids=["event-names-the-issue", "issue-null"])
def test_follow_up_and_stop_carry_the_conversations_issue(
    api: Api, linear: Linear, issue_in_event: bool
) -> None:
    """Linear's agentSession.issue may be null: a follow-up or stop then carries the issue the
    conversation started on (id and identifier), never an empty one; when the event names it, its
    full description."""
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-issue"))
    [start] = api.claim_all(token)
    assert ack(api, token, start) == 200

    def follow_up(**kw: Any) -> dict[str, Any]:
        event = agent_session_event(session_id="as-issue", action="prompted", **kw)
        if not issue_in_event:
            event["agentSession"]["issue"] = None
        return event

    api.webhook(follow_up(body="and the docs"))
    [prompt] = api.claim_all(token)
    assert ack(api, token, prompt) == 200
    api.webhook(follow_up(signal="stop"))
    [stop] = api.claim_all(token)
    for m in (prompt, stop):
        if issue_in_event:
            assert m["issue"] == start["issue"]
        else:
            assert (m["issue"]["id"], m["issue"]["identifier"]) == ("issue-as", "ENG-7")


def test_stop_racing_an_ack_one_outcome_each_time(api: Api, linear: Linear) -> None:
    """Linear's stop and the machine's ack of the start, at the same moment, 20 times: either the ack
    wins (the start is delivered, and a `stop` is queued for it) or the stop wins (the start is
    cancelled, the ack gets 404 and nothing runs). Never both, never neither."""
    _, token = api.register(user="user-1")
    for n in range(20):
        sid = f"as-race-{n}"
        api.webhook(agent_session_event(session_id=sid))
        [start] = api.claim_all(token)
        barrier = threading.Barrier(2)

        def do_ack(m: dict[str, Any] = start, barrier: threading.Barrier = barrier) -> int:
            barrier.wait()
            return ack(api, token, m)

        def do_stop(s: str = sid, barrier: threading.Barrier = barrier) -> dict[str, Any]:
            barrier.wait()
            answer: dict[str, Any] = api.webhook(
                agent_session_event(session_id=s, action="prompted", signal="stop")
            ).json()
            return answer

        with ThreadPoolExecutor(2) as ex:
            acked, stopped = ex.submit(do_ack), ex.submit(do_stop)
            code, answer = acked.result(), stopped.result()
        if code == 200:
            assert answer["cancelledSessionIds"] == [] and answer["stopSessionId"] is not None
            [stop] = api.claim_all(token)
            assert stop["kind"] == "stop"
            assert ack(api, token, stop) == 200
        else:
            assert code == 404 and answer["cancelledSessionIds"] == [start["sessionId"]]
            assert answer["stopSessionId"] is None and api.claim_all(token) == []


def test_human_reassignment_never_touches_the_agent_session(api: Api, linear: Linear) -> None:
    _, token = api.register(user="user-1")
    api.register(user="user-2")
    agent = api.webhook(agent_session_event(session_id="as-6", issue_id="iss-shared")).json()
    moved = issue_event(
        "update", issue_id="iss-shared", assignee="user-2", updated_from={"assigneeId": "user-1"}
    )
    assert api.webhook(moved).json()["status"] == "dispatched"
    [m] = api.claim_all(token)
    assert m["sessionId"] == agent["sessionId"]


def test_one_change_through_two_webhooks_or_replayed_dispatches_once(api: Api) -> None:
    api.register(user="user-1")
    event = issue_event(issue_id="iss-twice")
    first = api.webhook(event, delivery="workspace-webhook-1").json()
    assert first["status"] == "dispatched"
    for delivery in ("app-webhook-1", "replayed-with-a-new-id", None):
        again = api.webhook(event, delivery=delivery).json()
        assert again == {"status": "duplicate", "sessionId": first["sessionId"]}
    assert row_counts(api.pool)["sessions"] == 1


def test_non_ascii_signature_is_401_and_float_timestamps_are_accepted(api: Api) -> None:
    api.register(user="user-1")
    body = json.dumps(issue_event(issue_id="iss-sig")).encode()
    for signature in ("é" * 64, "\u2603", "ü", "0" * 10_000):
        r = api.http.post(
            "/webhook",
            content=body,
            headers={b"Linear-Signature": signature.encode("utf-8")},
        )
        refused(r, 401, "bad_signature")
    event = issue_event(issue_id="iss-float")
    event["webhookTimestamp"] = now_ms() + 0.5
    assert api.webhook(event).json()["status"] == "dispatched"


def delivered_session(api: Api, token: str, session_id: str) -> None:
    api.webhook(agent_session_event(session_id=session_id))
    for m in api.claim_all(token):
        assert ack(api, token, m) == 200


def activity(api: Api, token: str, session: str, content: dict[str, Any], aid: str | None = None) -> Any:
    body: dict[str, Any] = {"agentSessionId": session, "content": content}
    if aid:
        body["id"] = aid
    return api.post_as(token, "/activities", body)


def refused(r: Any, status: int, code: str) -> None:
    """The contract's error answer: that status, `{"error": code, "detail": <human text>}`."""
    body = r.json()
    assert (r.status_code, body["error"]) == (status, code), r.text
    assert isinstance(body.get("detail"), str) and body["detail"], r.text


def test_activities_idempotent_in_order_and_only_for_the_holder(api: Api, linear: Linear) -> None:
    oid, token = api.register(user="user-1")
    _, other_machine = api.register(user="user-2")
    _, other_org = api.register(org="org-b", user="user-1")
    delivered_session(api, token, "as-8")
    linear.wait(2)  # the service's own: queued for, picked up by
    aid = str(uuid4())
    first = activity(api, token, "as-8", {"type": "thought", "body": "reading the code"}, aid)
    assert first.status_code == 202 and first.json() == {"activityId": aid, "status": "queued"}
    again = activity(api, token, "as-8", {"type": "thought", "body": "reading the code"}, aid)
    assert again.status_code == 202 and again.json() == first.json()
    for n in range(5):
        assert (
            activity(
                api, token, "as-8", {"type": "action", "action": "Edit", "parameter": f"file-{n}"}
            ).status_code
            == 202
        )
    assert activity(api, token, "as-8", {"type": "response", "body": "done"}).status_code == 202
    linear.wait(2 + 7)
    time.sleep(0.3)
    posted = [a for a in linear.activities() if a["content"]["type"] != "thought" or a["id"] == aid]
    assert [a["id"] for a in linear.activities()].count(aid) == 1  # the retried id showed once
    assert [a["content"].get("parameter") for a in posted[1:6]] == [f"file-{n}" for n in range(5)]
    assert posted[-1]["content"] == {"type": "response", "body": "done"}

    before = row_counts(api.pool)
    for who, session in ((other_machine, "as-8"), (other_org, "as-8"), (token, "as-unknown")):
        r = activity(api, who, session, {"type": "thought", "body": "x"})
        refused(r, 404, "not_found")
    # An id already taken by another agent session's activity is not "the same id again" here,
    # even for a machine with activities of its own in this session: refused, nothing written.
    delivered_session(api, token, "as-9")
    taken = str(uuid4())
    assert activity(api, token, "as-9", {"type": "thought", "body": "elsewhere"}, taken).status_code == 202
    before = row_counts(api.pool)
    r = activity(api, token, "as-8", {"type": "thought", "body": "x"}, taken)
    refused(r, 404, "not_found")
    for bad in (
        {"agentSessionId": "as-8", "content": {"type": "shout", "body": "x"}},
        {"agentSessionId": "as-8", "content": {"type": "action", "body": "no action"}},
        {"agentSessionId": "as-8", "content": {"type": "thought"}},
        {"agentSessionId": "as-8", "content": {"type": "thought", "body": "x"}, "id": "not-a-uuid"},
        {"content": {"type": "thought", "body": "x"}},
    ):
        r = api.post_as(token, "/activities", bad)
        refused(r, 400, "bad_request")
    assert row_counts(api.pool) == before
    del oid


def test_an_undelivered_session_and_an_unconnected_org_are_refused(api: Api) -> None:
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-9"))
    r = activity(api, token, "as-9", {"type": "thought", "body": "too early"})
    refused(r, 404, "not_found")  # not delivered to it yet
    for m in api.claim_all(token):
        ack(api, token, m)
    r = activity(api, token, "as-9", {"type": "thought", "body": "no Linear"})
    refused(r, 409, "linear_not_connected")
    assert row_counts(api.pool)["notices"] == 0


def test_agent_token_speaks_only_in_its_own_session(api: Api, linear: Linear) -> None:
    oid, token = api.register(user="user-1")
    delivered_session(api, token, "as-10")
    delivered_session(api, token, "as-11")
    scoped = agent_tokens.mint(token, oid, "as-10")
    assert activity(api, scoped, "as-10", {"type": "thought", "body": "mine"}).status_code == 202
    r = activity(api, scoped, "as-11", {"type": "thought", "body": "not mine"})
    refused(r, 404, "not_found")
    forged = scoped[:-4] + ("0000" if not scoped.endswith("0000") else "1111")
    expired = agent_tokens.mint(token, oid, "as-10", now=time.time() - agent_tokens.LIFETIME_SECONDS - 10)
    for bad in (forged, expired, agent_tokens.mint("dpo_not_the_token", oid, "as-10")):
        r = activity(api, bad, "as-10", {"type": "thought", "body": "x"})
        refused(r, 401, "unauthorized")
    for path in ("/claim", "/ack", "/release"):  # it is good for /activities and nothing else
        assert api.post_as(scoped, path, {}).status_code == 401
    api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin())
    assert activity(api, scoped, "as-10", {"type": "thought", "body": "x"}).status_code == 401


def test_messages_of_a_session_are_delivered_in_order_under_concurrent_claimers(api: Api) -> None:
    """30 agent sessions, each a start and two follow-ups, drained by 6 concurrent claimers of the
    same machine: no session ever has two messages out at once, and each is acked in order."""
    oid, _ = api.register(user="user-1")
    sessions = [f"as-order-{n}" for n in range(30)]
    expected: dict[str, list[str]] = {}
    for s in sessions:
        ids = [api.webhook(agent_session_event(session_id=s)).json()["messageId"]]
        for body in ("one", "two"):
            ids.append(
                api.webhook(agent_session_event(session_id=s, action="prompted", body=body)).json()[
                    "messageId"
                ]
            )
        expected[s] = ids
    pool: Pool = api.pool
    out: dict[str, int] = defaultdict(int)
    acked: dict[str, list[str]] = defaultdict(list)
    lock = threading.Lock()
    overlaps: list[str] = []

    def drain() -> None:
        idle = 0
        while idle < 20:
            got = claim(pool, UUID(oid), max=3, lease_seconds=600)
            if not got:
                idle += 1
                time.sleep(0.01)
                continue
            idle = 0
            with lock:
                for m in got:
                    out[m.agent_session_id or ""] += 1
                    if out[m.agent_session_id or ""] > 1:
                        overlaps.append(m.agent_session_id or "")
            time.sleep(0.002)
            with lock:
                for m in got:
                    acked[m.agent_session_id or ""].append(str(m.message_id))
                    out[m.agent_session_id or ""] -= 1
            assert ack_many(pool, UUID(oid), [AckItem(m.queue_id, m.claim_token) for m in got]).statuses == [
                "acked"
            ] * len(got)

    threads = [threading.Thread(target=drain) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert overlaps == []
    assert dict(acked) == expected


def test_an_empty_poll_is_still_an_index_probe(api: Api) -> None:
    """The order rule sits in the claim statement; a machine with nothing due still costs one probe of
    the claim index, never a look at other machines' rows or the order check."""
    oid, token = api.register(user="user-1")
    busy, _ = api.register(user="user-2")
    bulk(
        api.pool,
        """
        WITH s AS (
            INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, issue_id, agent_session_id, kind)
            SELECT 'org-a', %(o)s, 'queued', 'bulk', 'as-bulk-' || (g %% 5000), 'prompt'
            FROM generate_series(1, 20000) g RETURNING id, agent_session_id
        )
        INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload, agent_session_id)
        SELECT s.id, %(o)s, 'org-a', '{"issue": {"id": "bulk"}}', s.agent_session_id FROM s
        """,
        {"o": busy},
    )
    bulk(
        api.pool,
        "UPDATE dispatch_sessions ds SET queue_id = q.id FROM dispatch_queue q WHERE q.session_id = ds.id",
    )
    with api.pool.connection() as conn:
        conn.execute("ANALYZE dispatch_queue")
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query_with_limit("claim", 10),
            {"orchestrator_id": oid, "max": 10, "lease_seconds": 60, "now": None},
        ).fetchone()
    assert plan is not None
    text = json.dumps(plan)
    assert "dispatch_queue_claim_idx" in text and "Seq Scan" not in text
    top = plan["QUERY PLAN"][0]["Plan"]
    assert top["Actual Rows"] == 0 and top["Shared Hit Blocks"] + top.get("Shared Read Blocks", 0) < 50
    del token


def test_activities_stay_idempotent_across_retries_and_a_sigkilled_service(
    pool: Pool, db_url: str, httpserver: HTTPServer
) -> None:
    """An agent retries each activity with its own id until it gets a 202, while `devpilot serve` is
    SIGKILLed between (and during) the tries: every activity is in Linear exactly once, in order."""
    import httpx

    from shared.fleet.orchestrators import register
    from tests.helpers.api import ADMIN, SECRET
    from tests.helpers.data import ENCRYPTION_KEY
    from tests.helpers.serving import free_port, start_serve, wait_healthy

    stand_in = Linear(httpserver)
    orch = register(pool, org_id="org-a", linear_user_id="user-1", name="m")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"LINEAR_API_URL": httpserver.url_for("/graphql"), "DEVPILOT_ENCRYPTION_KEYS": ENCRYPTION_KEY}
    server = start_serve(db_url, port, env)
    try:
        wait_healthy(url)
        with httpx.Client(base_url=url, timeout=5) as http:
            stored = http.post(
                "/linear-credentials",
                json={"orgId": "org-a", "accessToken": "lin"},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert stored.status_code == 200, stored.text
            event = json.dumps(agent_session_event(session_id="as-kill")).encode()
            from shared.linear.webhooks import sign

            http.post("/webhook", content=event, headers={"Linear-Signature": sign(SECRET, event)})
            auth = {"Authorization": f"Bearer {orch.token}"}
            [m] = http.post("/claim", json={}, headers=auth).json()["messages"]
            assert (
                http.post(
                    "/ack", json={"queueId": m["queueId"], "claimToken": m["claimToken"]}, headers=auth
                ).status_code
                == 200
            )
            ids = [str(uuid4()) for _ in range(12)]
            for n, aid in enumerate(ids):
                body = {
                    "agentSessionId": "as-kill",
                    "content": {"type": "thought", "body": f"step {n}"},
                    "id": aid,
                }
                accepted, killed = 0, False
                while accepted < 2:  # each activity is sent (at least) twice: a retry after success
                    if n % 3 == accepted and not killed:  # before the first try, or between the two
                        server.send_signal(signal.SIGKILL)
                        server.wait()
                        server = start_serve(db_url, port, env)
                        killed = True
                    try:
                        r = http.post("/activities", json=body, headers=auth)
                        if r.status_code == 202:
                            assert r.json()["activityId"] == aid
                            accepted += 1
                            continue
                        assert r.status_code == 503, r.text
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.1)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(
                [a for a in stand_in.activities() if a["id"] in ids]
            ) < len(ids):
                with contextlib.suppress(httpx.HTTPError):  # (the last restart may still be starting)
                    http.post(
                        "/sweep", headers={"Authorization": f"Bearer {ADMIN}"}
                    )  # sends what a kill left unsent
                time.sleep(0.3)
    finally:
        server.kill()
        server.wait()
    # What Linear shows: a post retried with the same id shows once (Linear: "a retried post with
    # the same id never shows twice"). A SIGKILL between Linear's answer and the outbox recording it
    # means the sweep posts that id again, by design; the id is what makes it exactly once.
    shown = list(dict.fromkeys(a["id"] for a in stand_in.activities() if a["id"] in ids))
    assert shown == ids  # each shown exactly once, in the order accepted
    assert not stand_in.invalid


def test_a_follow_up_after_a_stop_that_reached_no_machine_starts_afresh(api: Api, linear: Linear) -> None:
    """A stop before any delivery cancels the conversation's start: no machine holds it. The user's
    next follow-up is routed as a start, carrying what they asked, not queued as a prompt for a
    machine that never heard of the conversation."""
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-restart"))
    api.webhook(agent_session_event(session_id="as-restart", action="prompted", signal="stop"))
    r = api.webhook(agent_session_event(session_id="as-restart", action="prompted", body="try again")).json()
    assert r["status"] == "dispatched" and r["kind"] == "start"
    [m] = api.claim_all(token)
    assert (m["kind"], m["prompt"]["body"]) == ("start", "try again")


@pytest.mark.parametrize("delivered", [False, True])
def test_a_follow_up_written_before_the_stop_and_handled_after_it_does_nothing(
    api: Api, delivered: bool
) -> None:
    """The person writes a follow-up, then presses stop. The follow-up's delivery fails and Linear
    retries it after the stop was handled (or it reached another instance first). It must not put
    the agent back to work: neither start the conversation again (the stop cancelled a start no
    machine had) nor reach the machine after its `stop` (the machine has the conversation). A
    follow-up written after the stop goes on as before."""
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-order"))
    if delivered:
        [m] = api.claim_all(token)
        api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    written = agent_session_event(session_id="as-order", action="prompted", body="and the docs")
    stop = api.webhook(agent_session_event(session_id="as-order", action="prompted", signal="stop")).json()
    assert stop["status"] == "stopped"
    late = api.webhook(written).json()
    assert late == {"status": "ignored", "reason": "agent_session_stopped"}
    assert [m["kind"] for m in api.claim_all(token)] == (["stop"] if delivered else [])
    then = api.webhook(agent_session_event(session_id="as-order", action="prompted", body="now go on")).json()
    assert (then["status"], then["kind"]) == ("dispatched", "prompt" if delivered else "start")


def test_stops_handled_out_of_order_keep_the_latest_time(api: Api) -> None:
    """Two stops, and between them a follow-up. The later stop is handled first, then the earlier
    one (Linear's retry), then the follow-up: it was written before the later stop, so it does
    nothing, though the stop handled last is older than it."""
    _, token = api.register(user="user-1")
    api.webhook(agent_session_event(session_id="as-two-stops"))
    first = agent_session_event(session_id="as-two-stops", action="prompted", signal="stop")
    between = agent_session_event(session_id="as-two-stops", action="prompted", body="in between")
    second = agent_session_event(session_id="as-two-stops", action="prompted", signal="stop")
    assert api.webhook(second).json()["status"] == "stopped"
    assert api.webhook(first).json()["status"] == "stopped"
    late = api.webhook(between).json()
    assert late == {"status": "ignored", "reason": "agent_session_stopped"}
    assert api.claim_all(token) == []


def _sessions_of(api: Api, agent_session: str) -> list[tuple[str, str]]:
    with api.pool.connection() as conn:
        rows = conn.execute(
            "SELECT kind, status FROM dispatch_sessions WHERE agent_session_id = %s ORDER BY created_at",
            (agent_session,),
        ).fetchall()
    return [(r["kind"], r["status"]) for r in rows]


def test_a_created_handled_after_its_stop_starts_nothing(api: Api, linear: Linear) -> None:
    """Linear's `created` can reach us after the stop the person pressed next: its first delivery
    failed and Linear retries it a minute later, or it reached another instance of the service,
    which had not written it yet. The stop found nothing to stop and told Linear so; the late
    `created` must not start the agent after all."""
    _, token = api.register(user="user-1")
    stop = api.webhook(agent_session_event(session_id="as-late", action="prompted", signal="stop")).json()
    assert stop == {"status": "stopped", "cancelledSessionIds": [], "stopSessionId": None}
    late = api.webhook(agent_session_event(session_id="as-late")).json()
    assert late == {"status": "ignored", "reason": "agent_session_stopped"}
    assert api.claim_all(token) == [] and _sessions_of(api, "as-late") == []
    linear.wait(1)
    time.sleep(0.3)  # (nothing more comes: no "Queued for" for a start that was never queued)
    assert [a["content"]["type"] for a in linear.activities()] == ["response"]


def test_a_created_handled_after_a_follow_up_that_started_it_starts_nothing_more(
    api: Api, linear: Linear
) -> None:
    """A follow-up handled before its agent session's `created` finds no machine holding the
    conversation and starts it, carrying what was asked. The `created` that comes after must not
    start it a second time: one conversation, one start."""
    _, token = api.register(user="user-1")
    first = api.webhook(
        agent_session_event(session_id="as-swap", action="prompted", body="and the docs")
    ).json()
    assert first["status"] == "dispatched" and first["kind"] == "start"
    late = api.webhook(agent_session_event(session_id="as-swap", body="@agent fix it")).json()
    assert late == {"status": "ignored", "reason": "agent_session_started"}
    [m] = api.claim_all(token)
    assert (m["kind"], m["prompt"]["body"]) == ("start", "and the docs")
    assert _sessions_of(api, "as-swap") == [("start", "queued")]


def test_a_created_handled_after_a_follow_up_still_being_routed_starts_nothing_more(api: Api) -> None:
    """An agent session an automation started: its first follow-up, handled first, waits for Linear
    to name the machine (a routing request). The `created` that comes meanwhile must not become a
    second message of it."""
    _, token = api.register(user="user-1")
    with api.pool.connection() as conn:
        conn.execute(
            "INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message)"
            " VALUES ('org-a', 'as-routing', 'issue-as', 'assignee', '{}')"
        )
    late = api.webhook(agent_session_event(session_id="as-routing")).json()
    assert late == {"status": "ignored", "reason": "agent_session_started"}
    assert api.claim_all(token) == [] and _sessions_of(api, "as-routing") == []


def test_a_start_that_fails_takes_the_follow_ups_queued_behind_it(api: Api, linear: Linear) -> None:
    """A start no machine acks is dead-lettered at the attempt limit. The follow-ups the user sent
    while it waited belong to a conversation no machine has: they fail with it (Linear told once),
    instead of reaching the machine later as prompts of a conversation it never started. The next
    follow-up starts the conversation afresh."""
    from datetime import UTC, datetime, timedelta

    from shared.delivery.queue import sweep
    from shared.linear import notices

    oid, token = api.register(user="user-1")
    start = api.webhook(agent_session_event(session_id="as-dead")).json()
    follow = api.webhook(agent_session_event(session_id="as-dead", action="prompted", body="and?")).json()
    assert follow["kind"] == "prompt"
    later = datetime.now(UTC)
    for _ in range(api.settings.max_attempts):  # claimed, never acked, the lease runs out
        later += timedelta(hours=1)
        [m] = claim(api.pool, UUID(oid), max=10, lease_seconds=60, now=later)
        assert m.session_id == UUID(start["sessionId"])
        sweep(api.pool, api.settings, now=later + timedelta(minutes=2))
    with api.pool.connection() as conn:
        rows = conn.execute("SELECT id::text, status FROM dispatch_sessions").fetchall()
    assert {r["id"]: r["status"] for r in rows} == {
        start["sessionId"]: "failed",
        follow["sessionId"]: "failed",
    }
    assert row_counts(api.pool)["queue"] == 0
    with api.pool.connection() as conn:  # Linear hears of the failure once, for the start
        told = conn.execute(
            "SELECT session_id::text AS s FROM linear_notices WHERE agent_session_id = 'as-dead' AND kind = 'failed'"
        ).fetchall()
    assert [r["s"] for r in told] == [start["sessionId"]]
    notices.send_pending(api.pool, api.settings)  # (what the service's sweep does next)
    linear.wait(2)  # the first thought, and one failure notice
    assert [a["content"]["type"] for a in linear.activities()] == ["thought", "error"]
    r = api.webhook(agent_session_event(session_id="as-dead", action="prompted", body="retry")).json()
    assert r["status"] == "dispatched" and r["kind"] == "start"
    [m2] = api.claim_all(token)
    assert (m2["kind"], m2["prompt"]["body"]) == ("start", "retry")
