"""Bad input and security: fuzzed bodies, the access matrix, tokens never logged."""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.linear.webhooks import sign
from tests.helpers.api import ADMIN, SECRET, Api, issue_event
from tests.helpers.data import row_counts

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=12,
)
FIELDS = [
    "type",
    "action",
    "webhookTimestamp",
    "data",
    "agentSession",
    "organizationId",
    "updatedFrom",
    "max",
    "waitSeconds",
    "queueId",
    "claimToken",
    "acks",
    "reason",
    "orgId",
    "linearUserId",
    "name",
    "id",
    "assigneeId",
    "creatorId",
    "issue",
]
# Objects shaped like the real ones, with wrong or odd values: reaches deeper than random JSON.
SHAPED = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8)
FUZZ = settings(
    max_examples=1500 if os.environ.get("DEVPILOT_HEAVY") == "1" else 150,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def counts(api: Api) -> dict[str, int]:
    return row_counts(api.pool)


@FUZZ
@given(body=JSON | SHAPED, raw=st.binary(max_size=64))
def test_fuzzed_webhooks_never_5xx_and_write_only_when_accepted(api: Api, body: Any, raw: bytes) -> None:
    if not hasattr(api, "_fuzz_orch"):
        api.register(user="user-1")
        api._fuzz_orch = True  # type: ignore[attr-defined]
    for payload in (json.dumps(body).encode(), raw):
        before = counts(api)
        r = api.webhook({}, raw=payload, delivery=str(uuid.uuid4()))
        assert r.status_code < 500, r.text
        assert set(r.json()) >= ({"status"} if r.status_code == 200 else {"error", "detail"})
        if r.status_code != 200:
            assert counts(api) == before


@FUZZ
@given(
    path=st.sampled_from(["/claim", "/ack", "/release", "/realtime-token", "/machine"]), body=JSON | SHAPED
)
def test_fuzzed_orchestrator_bodies_never_5xx_or_write(api: Api, path: str, body: Any) -> None:
    if not hasattr(api, "_fuzz_token"):
        api._fuzz_token = api.register()[1]  # type: ignore[attr-defined]
    before = counts(api)
    r = api.http.post(path, content=json.dumps(body), headers={"Authorization": f"Bearer {api._fuzz_token}"})  # type: ignore[attr-defined]
    assert r.status_code < 500, r.text
    assert counts(api) == before  # nothing queued, so a claim/ack/release has nothing to write either


@FUZZ
@given(body=JSON | SHAPED)
def test_fuzzed_admin_bodies_never_5xx(api: Api, body: Any) -> None:
    before = counts(api)
    r = api.http.post("/orchestrators", content=json.dumps(body), headers=api.admin())
    assert r.status_code in (201, 400), r.text
    if r.status_code == 400:
        assert counts(api) == before


ROUTES = [
    ("POST", "/claim"),
    ("POST", "/ack"),
    ("POST", "/release"),
    ("POST", "/realtime-token"),
    ("POST", "/machine"),
    ("POST", "/activities"),
]
ADMIN_ROUTES = [
    ("POST", "/orchestrators"),
    ("GET", "/orchestrators"),
    ("POST", "/sweep"),
    ("POST", "/orchestrators/{oid}/revoke"),
]


def test_access_matrix(api: Api) -> None:
    """No token, a wrong token, a revoked token, an admin token where an orchestrator's is expected,
    an orchestrator's token on admin routes, and another org's orchestrator: each gets the contract's
    answer and touches nothing."""
    mine_id, mine = api.register(org="org-a", user="u-a")
    _, theirs = api.register(org="org-b", user="u-b")
    gone_id, gone = api.register(org="org-a", user="u-gone")
    api.http.post(f"/orchestrators/{gone_id}/revoke", headers=api.admin())
    api.webhook(issue_event(org="org-a", assignee="u-a"))
    [m] = api.post_as(mine, "/claim").json()["messages"]
    body = {"queueId": m["queueId"], "claimToken": m["claimToken"], "max": 10}
    before = counts(api)
    bad = {
        "none": {},
        "wrong": {"Authorization": "Bearer dpo_wrong"},
        "revoked": {"Authorization": f"Bearer {gone}"},
        "admin": {"Authorization": f"Bearer {ADMIN}"},
        "basic": {"Authorization": f"Basic {mine}"},
    }
    for method, path in ROUTES:
        for who, headers in bad.items():
            r = api.http.request(method, path, json=body, headers=headers)
            assert (r.status_code, r.json()["error"]) == (401, "unauthorized"), (path, who)
    for method, path in ADMIN_ROUTES:
        for who, headers in {**bad, "orchestrator": {"Authorization": f"Bearer {mine}"}}.items():
            if who == "admin":
                continue
            r = api.http.request(
                method,
                path.format(oid=mine_id),
                json={"orgId": "x", "linearUserId": "y", "name": "z"},
                headers=headers,
            )
            assert (r.status_code, r.json()["error"]) == (401, "unauthorized"), (path, who)
    # another org's orchestrator sees nothing of this one's work
    other = {"Authorization": f"Bearer {theirs}"}
    assert api.http.post("/claim", json={}, headers=other).json() == {"messages": []}
    for path in ("/ack", "/release"):
        r = api.http.post(path, json=body, headers=other)
        assert (r.status_code, r.json()["error"]) == (404, "not_found")
    assert counts(api) == before
    # and the owner's claim is intact
    assert api.post_as(mine, "/ack", body).json() == {"status": "acked"}


def test_no_log_line_holds_a_token_or_the_secret(
    api: Api, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    oid, token = api.register()
    api.webhook(issue_event())
    [m] = api.post_as(token, "/claim").json()["messages"]
    api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    api.post_as(token, "/claim", {"max": "bad"})
    api.http.post("/claim", json={}, headers={"Authorization": "Bearer dpo_guess"})
    api.http.post("/sweep", headers=api.admin())
    body = b'{"type":"Issue"}'
    api.http.post("/webhook", content=body, headers={"Linear-Signature": sign(SECRET, body)})
    api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin())
    logged = caplog.text + capsys.readouterr().err
    assert '"route":"claim"' in logged  # the request lines were captured
    for secret in (token, ADMIN, SECRET, "dpo_guess", sign(SECRET, body)):
        assert secret not in logged
