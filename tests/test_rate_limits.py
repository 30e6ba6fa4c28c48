"""Linear's rate limit is a wait, never a loss (docs/linear-rate-limits.md), against the stand-in
Linear answering `RATELIMITED` as Linear does (HTTP 400, `extensions.code`, the budget's headers).

Time is simulated, as the suite moves it elsewhere: the stand-in's clock is moved forward, and the
database's due times with it (`advance`); the sweep then runs as its timer would."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from devpilot.status_view import render
from shared.linear import api as linear_api
from shared.operators.status import snapshot
from tests.helpers.api import Api, agent_session_event
from tests.helpers.linear import Linear, linear_settings
from tests.test_conversations import ack, activity

MINUTE = 60.0


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    # A short attempt limit: before, four refusals in a row gave a post up.
    return linear_settings(httpserver, DEVPILOT_MAX_ATTEMPTS=3, DEVPILOT_METRICS=True)


def connect(api: Api, org: str, token: str) -> None:
    r = api.http.post("/linear-credentials", json={"orgId": org, "accessToken": token}, headers=api.admin())
    assert r.status_code == 200, r.text


def posts(api: Api, org: str) -> list[dict[str, Any]]:
    with api.pool.connection() as conn:
        return [
            dict(r)
            for r in conn.execute(
                "SELECT id, body, sent_at, attempts, ephemeral, superseded_by FROM linear_notices"
                " WHERE org_id = %s AND kind = 'activity' ORDER BY seq",
                (org,),
            )
        ]


def advance(api: Api, linear: Linear, seconds: float) -> None:
    """Time passes: on Linear's clock, and for every time the service compares with now()."""
    linear.advance(seconds)
    with api.pool.connection() as conn:
        conn.execute(
            "UPDATE linear_paces SET blocked_until = blocked_until - make_interval(secs => %s)", (seconds,)
        )
        conn.execute(
            "UPDATE linear_notices SET available_at = available_at - make_interval(secs => %s)"
            " WHERE sent_at IS NULL AND available_at < 'infinity'",
            (seconds,),
        )


def _until_none(api: Api, rows: str, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with api.pool.connection() as conn:
            row = conn.execute(f"SELECT count(*) AS n FROM linear_notices WHERE {rows}").fetchone()  # (ours)
        if row is not None and row["n"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(what)


def settle(api: Api) -> None:
    """Until the posts sent after the commits are marked (sent, or put back waiting)."""
    _until_none(api, "lease_expires_at > now() AND sent_at IS NULL", "posts still in flight")


def drained(api: Api) -> None:
    """Until every post the service wrote so far went out."""
    _until_none(api, "sent_at IS NULL AND available_at < 'infinity'", "posts still unsent")


def sweep(api: Api) -> None:
    assert api.http.post("/sweep", headers=api.admin()).status_code == 200


def delivered(api: Api, token: str, org: str, session: str) -> None:
    api.webhook(agent_session_event(org=org, session_id=session))
    for m in api.claim_all(token):
        assert ack(api, token, m) == 200


def said(linear: Linear, session: str) -> list[str]:
    return [a["content"].get("body") or "" for a in linear.activities() if a["agentSessionId"] == session]


def test_a_workspace_over_linears_limit_for_20_minutes_loses_nothing(
    api: Api, httpserver: HTTPServer
) -> None:
    """Org A's Linear refuses every call for 20 minutes, each refusal naming a reset 5 minutes away
    (a leaky bucket refills little by little). Nothing of A is given up, though it is refused four
    times, over the attempt limit; its posts are not even tried again before each reset; they
    arrive in the order the agent wrote them once the limit is over. Org B's posts go at once the
    whole time. The page, `devpilot status`, the dashboard and /metrics say A waits, until when."""
    linear = Linear(httpserver)
    connect(api, "org-a", "tok-a")
    connect(api, "org-b", "tok-b")
    _, a = api.register(org="org-a", user="user-1", name="a-box")
    _, b = api.register(org="org-b", user="user-1", name="b-box")
    delivered(api, a, "org-a", "as-a")
    delivered(api, b, "org-b", "as-b")
    delivered(api, a, "org-a", "as-a2")  # a second conversation in A: the wait is the workspace's
    drained(api)
    with api.pool.connection() as conn:
        row = conn.execute("SELECT id FROM dispatch_sessions WHERE agent_session_id = 'as-a'").fetchone()
    assert row is not None
    page_id = row["id"]

    linear.rate_limit("tok-a", 20 * MINUTE, reset_every=5 * MINUTE)
    for n in range(6):
        assert activity(api, a, "as-a", {"type": "thought", "body": f"a{n}"}).status_code == 202
    for n in range(3):
        assert activity(api, b, "as-b", {"type": "thought", "body": f"b{n}"}).status_code == 202
    settle(api)
    assert activity(api, a, "as-a2", {"type": "thought", "body": "c0"}).status_code == 202
    settle(api)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and said(linear, "as-b")[-3:] != ["b0", "b1", "b2"]:
        time.sleep(0.05)
    assert said(linear, "as-b")[-3:] == ["b0", "b1", "b2"]  # B: at once
    assert len(linear.limited) == 1  # A: its first post refused, the others not even tried
    assert [p["sent_at"] for p in posts(api, "org-a")][-7:] == [None] * 7
    assert [p["attempts"] for p in posts(api, "org-a")][-7:] == [0] * 7  # a refusal is no attempt

    # What the operators see while A waits.
    snap = snapshot(api.pool)
    [pace] = [c for c in snap.to_json()["linear"] if c["orgId"] == "org-a"]
    assert pace["rateLimitedUntil"] is not None and pace["rateLimitedAnswers"] == 1, pace
    [other] = [c for c in snap.to_json()["linear"] if c["orgId"] == "org-b"]
    assert other["rateLimitedUntil"] is None
    from rich.console import Console

    console = Console(record=True, width=200)
    render(snap, console)
    assert "waiting for Linear's rate limit until" in console.export_text()
    board = api.http.get("/dashboard", headers=api.admin()).text
    assert re.search(r'data-org="org-a".*waiting for Linear&#x27;s rate limit until', board), board
    page = api.http.get(f"/sessions/{page_id}", headers=api.admin()).text
    assert 'id="linear-pace"' in page and page.count('class="bad paced"') == 6, page

    # Twenty minutes pass. Each 5-minute reset, the sweep tries A's first post again (refused while
    # the limit lasts), never before: half way to a reset it tries nothing. B keeps going.
    for step in range(4):
        advance(api, linear, 2.5 * MINUTE)
        sweep(api)
        assert len(linear.limited) == 1 + step, "a post was tried before the reset Linear gave"
        assert activity(api, b, "as-b", {"type": "thought", "body": f"b-{step}"}).status_code == 202
        settle(api)
        advance(api, linear, 2.5 * MINUTE)
        sweep(api)
        settle(api)
    assert said(linear, "as-b")[-4:] == [f"b-{step}" for step in range(4)]
    assert len(linear.limited) == 4  # refused at 0, 5, 10 and 15 minutes; accepted at 20
    sent = posts(api, "org-a")[-7:]
    assert said(linear, "as-a")[-6:] == [f"a{n}" for n in range(6)]  # all, once each, in order
    assert said(linear, "as-a2")[-1:] == ["c0"]
    assert all(p["sent_at"] is not None for p in sent)
    assert [p["attempts"] for p in sent] == [1] * 7  # only the post that went counts

    scrape = api.http.get("/metrics", headers=api.admin()).text
    assert 'devpilot_linear_ratelimited_answers_total{org_id="org-a"} 4.0' in scrape, scrape
    assert 'devpilot_linear_ratelimited_answers_total{org_id="org-b"} 0.0' in scrape
    assert 'devpilot_linear_paced_seconds{org_id="org-a"} 0.0' in scrape


def test_an_ephemeral_post_replaced_before_it_was_sent_is_not_sent(api: Api, httpserver: HTTPServer) -> None:
    """While the workspace waits for Linear's limit, the agent's progress (`ephemeral`) is replaced
    by its next post: only the last of them, and the posts that are not ephemeral, go once the wait
    is over. The page says which were replaced."""
    linear = Linear(httpserver)
    connect(api, "org-a", "tok-a")
    _, a = api.register(org="org-a", user="user-1", name="a-box")
    delivered(api, a, "org-a", "as-a")
    drained(api)
    linear.rate_limit("tok-a", 5 * MINUTE)
    assert activity(api, a, "as-a", {"type": "thought", "body": "first"}).status_code == 202
    settle(api)
    for n in range(3):
        body = {
            "agentSessionId": "as-a",
            "content": {"type": "thought", "body": f"step {n}"},
            "ephemeral": True,
        }
        assert api.post_as(a, "/activities", body).status_code == 202
    assert (
        activity(api, a, "as-a", {"type": "action", "action": "Edit", "parameter": "x.py"}).status_code == 202
    )
    advance(api, linear, 5 * MINUTE)
    sweep(api)
    settle(api)
    went = [w for w in linear.activities() if w["agentSessionId"] == "as-a"]
    contents = [w["content"].get("body") or w["content"].get("parameter") for w in went][-2:]
    assert contents == ["first", "x.py"], went  # the three ephemeral steps: replaced, never sent
    replaced = [p for p in posts(api, "org-a") if p["ephemeral"]]
    assert len(replaced) == 3 and all(p["sent_at"] is None and p["superseded_by"] for p in replaced)
    with api.pool.connection() as conn:
        row = conn.execute("SELECT id FROM dispatch_sessions WHERE agent_session_id = 'as-a'").fetchone()
    assert row is not None
    sid = row["id"]
    page = api.http.get(f"/sessions/{sid}", headers=api.admin()).text
    assert page.count('class="muted superseded"') == 3 and "given up" not in page


@pytest.mark.parametrize(
    ("status", "headers", "seconds", "budget"),
    [
        # Linear's answer: 400, RATELIMITED, the requests budget spent, its reset in epoch ms
        (
            400,
            {"X-RateLimit-Requests-Remaining": "0", "X-RateLimit-Requests-Reset": "1800000300000"},
            300,
            "requests",
        ),
        # the complexity budget spent, the requests budget not: the complexity reset counts
        (
            400,
            {
                "X-RateLimit-Requests-Remaining": "10",
                "X-RateLimit-Requests-Reset": "1800000010000",
                "X-RateLimit-Complexity-Remaining": "0",
                "X-RateLimit-Complexity-Reset": "1800000120000",
            },
            120,
            "complexity",
        ),
        (429, {"Retry-After": "7"}, 7, "retry-after"),
        (400, {}, linear_api.DEFAULT_WAIT_SECONDS, "unknown"),  # no reset named: a minute
        (400, {"X-RateLimit-Requests-Reset": str(10**14)}, linear_api.LONGEST_WAIT_SECONDS, "requests"),
        (400, {"X-RateLimit-Requests-Reset": "1799999000000"}, 1, "requests"),  # in the past: a second
    ],
)
def test_how_long_a_refusal_waits(status: int, headers: dict[str, str], seconds: float, budget: str) -> None:
    body = {"errors": [{"message": "Rate limit exceeded", "extensions": {"code": "RATELIMITED"}}]}
    assert linear_api.rate_limited(status, body if status == 400 else None)
    assert linear_api.reset_in(headers, now=1_800_000_000.0) == (seconds, budget)
    assert not linear_api.rate_limited(400, {"errors": [{"message": "Argument Validation Error"}]})
