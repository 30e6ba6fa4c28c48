"""The right machine for the repository, over real HTTP against real Postgres and the stand-in
Linear (every GraphQL document checked against Linear's schema; `issueRepositorySuggestions`
answered from a table the test sets): machines say what they have; a user whose machines differ
gets each start on the machine with the issue's repository (Linear's suggestion, or the person's
pick in an agent session, or the best suggestion for a plain assignment); a label narrows; Linear
down routes as before and says so; a machine that lacks the repository gives the start back and it
is routed again; 200 starts at once are each routed once and claimed once."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from html import unescape
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from functions.pages import ME_COOKIE
from shared.fleet import people
from shared.plumbing.db import transaction
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.linear import Linear, linear_settings, root_field

BACKEND = {"hostname": "github.com", "fullName": "acme/backend"}
WEB = {"hostname": "github.com", "fullName": "acme/web"}


@pytest.fixture
def api_overrides(httpserver: HTTPServer) -> dict[str, object]:
    return linear_settings(httpserver)


def machine(
    api: Api, name: str, repos: list[dict[str, str]], labels: list[str] | None = None
) -> tuple[str, str]:
    """A machine of user-1 that says what it has (and is, by that, the most recently seen)."""
    oid, token = api.register(user="user-1", name=name)
    r = api.post_as(token, "/machine", {"repositories": repos, "labels": labels or []})
    assert r.status_code == 200, r.text
    return oid, token


def ack(api: Api, token: str, m: dict[str, Any]) -> None:
    r = api.post_as(token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    assert r.json() == {"status": "acked"}, r.text


def wait_claim(api: Api, token: str, n: int = 1, timeout: float = 10.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += api.claim_all(token)
        if len(got) < n:
            time.sleep(0.05)
    assert len(got) == n, got
    return got


def reads(linear: Linear, field: str) -> list[dict[str, Any]]:
    """The arguments of each call for `field`, as Linear reads them (every call schema-valid)."""
    assert not linear.invalid, linear.invalid
    return linear.asked(field)


def said(linear: Linear, agent_session: str) -> list[dict[str, Any]]:
    return [a for a in linear.activities() if a["agentSessionId"] == agent_session]


def wait_said(linear: Linear, agent_session: str, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(said(linear, agent_session)) < n:
        time.sleep(0.02)
    assert not linear.invalid, linear.invalid
    return said(linear, agent_session)


def note_of(api: Api, session_id: str) -> str | None:
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT routing_note FROM dispatch_sessions WHERE id = %s", (session_id,)
        ).fetchone()
    assert row is not None
    note: str | None = row["routing_note"]
    return note


def page_note(api: Api, session_id: str) -> str | None:
    """How the machine was chosen, as the session's page shows it (read back from its HTML)."""
    r = api.http.get(f"/sessions/{session_id}", headers=api.admin())
    assert r.status_code == 200, r.text
    found = re.search(r'<td id="routing">([^<]*)</td>', r.text)
    return None if found is None else unescape(found.group(1))


# --- machines say what they have -------------------------------------------------------------------


def test_a_machine_says_what_it_has_and_saying_it_again_replaces_it(api: Api) -> None:
    oid, token = api.register(user="user-1", name="backend-box")
    r = api.post_as(
        token,
        "/machine",
        {
            "repositories": [BACKEND, {"hostname": "GitHub.com", "fullName": "Acme/Backend"}],
            "labels": ["GPU", "gpu"],
        },
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "orchestratorId": oid,
        "name": "backend-box",
        "repositories": [BACKEND],
        "labels": ["gpu"],
    }
    listed = {
        o["orchestratorId"]: o
        for o in api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]
    }
    assert (listed[oid]["repositories"], listed[oid]["labels"]) == ([BACKEND], ["gpu"])
    assert api.post_as(token, "/machine", {"repositories": [WEB]}).json()["repositories"] == [WEB]
    listed = {
        o["orchestratorId"]: o
        for o in api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]
    }
    assert (listed[oid]["repositories"], listed[oid]["labels"]) == ([WEB], [])  # replaced, labels too
    api.post_as(token, "/machine", {"repositories": [WEB], "labels": ["gpu"]})
    page = api.http.get("/dashboard", headers=api.admin()).text
    assert '<td class="has">acme/web, label gpu</td>' in page  # the operators' page shows it too
    # and the person's own view: /me (its JSON, what `whoami` and `machines` print; its page)
    [mine] = api.http.get("/me", headers={"Authorization": f"Bearer {token}"}).json()["orchestrators"]
    assert (mine["repositories"], mine["labels"]) == ([WEB], ["gpu"])
    with transaction(api.pool) as tx:
        session = people.start_session(tx, "org-a", "user-1")
    own = api.http.get("/me", headers={"Cookie": f"{ME_COOKIE}={session}"}).text
    assert '<td class="has">acme/web, label gpu</td>' in own
    for bad in (
        {"repositories": [{"hostname": "github.com", "fullName": "no-slash"}]},
        {"repositories": [{"hostname": "not a host", "fullName": "acme/x"}]},
        {"repositories": "acme/x"},
        {"labels": ["x" * 65]},
        {"labels": [""]},
    ):
        r = api.post_as(token, "/machine", bad)
        assert r.status_code == 400 and r.json()["error"] == "bad_request", (bad, r.text)
    listed = {
        o["orchestratorId"]: o
        for o in api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]
    }
    assert (listed[oid]["repositories"], listed[oid]["labels"]) == (
        [WEB],
        ["gpu"],
    )  # nothing written by a refusal
    assert api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin()).status_code == 200
    assert api.post_as(token, "/machine", {"repositories": [BACKEND]}).status_code == 401


# --- routing a start -------------------------------------------------------------------------------


def test_alike_machines_never_ask_linear(api: Api, linear: Linear) -> None:
    """Rule 1: all the user's machines have the same repositories (spelled differently, in another
    order): dispatched at once to the most recently seen, no routing request, Linear not asked."""
    machine(api, "laptop", [BACKEND, WEB])
    newest, token = machine(api, "workstation", [{"hostname": "github.com", "fullName": "ACME/web"}, BACKEND])
    for event in (
        issue_event(issue_id="iss-alike"),
        agent_session_event(session_id="as-alike", issue_id="iss-2"),
    ):
        answer = api.webhook(event).json()
        assert answer["status"] == "dispatched" and answer["orchestratorId"] == newest
    claimed = api.claim_all(token)
    assert [m["repository"] for m in claimed] == [None, None]
    assert page_note(api, claimed[0]["sessionId"]) is None  # nothing was chosen, nothing to say
    time.sleep(0.2)
    assert reads(linear, "issueRepositorySuggestions") == [] and reads(linear, "issue") == []


def test_each_issue_goes_to_the_machine_with_its_repository(api: Api, linear: Linear) -> None:
    """Rule 2: Linear's suggestion at or above the confidence picks the repository; the start goes
    to the machine that has it (not to the most recently seen), the message names it, and Linear
    hears where. The candidates asked about are the union of the user's machines' repositories."""
    backend_id, backend = machine(api, "backend-box", [BACKEND])
    _, web = machine(api, "web-box", [WEB])  # (the most recently seen)
    linear.suggestions["iss-back"] = {"acme/backend": 0.92, "acme/web": 0.1}
    linear.suggestions["iss-web"] = {"acme/web": 0.81}
    assert api.webhook(issue_event(issue_id="iss-back")).json()["status"] == "routing"
    r = api.webhook(agent_session_event(session_id="as-web", issue_id="iss-web")).json()
    assert r["status"] == "routing"
    [on_backend] = wait_claim(api, backend)
    [on_web] = wait_claim(api, web)
    assert (on_backend["issue"]["id"], on_backend["repository"]) == ("iss-back", BACKEND)
    assert (on_web["issue"]["id"], on_web["repository"], on_web["kind"]) == ("iss-web", WEB, "start")
    assert on_backend["orchestratorId"] == backend_id
    asked = reads(linear, "issueRepositorySuggestions")
    assert sorted(a["issueId"] for a in asked) == ["iss-back", "iss-web"]
    for a in asked:
        assert sorted(c["repositoryFullName"] for c in a["candidateRepositories"]) == [
            "acme/backend",
            "acme/web",
        ]
    assert {a["issueId"]: a["agentSessionId"] for a in asked} == {"iss-back": None, "iss-web": "as-web"}
    [queued] = wait_said(linear, "as-web", 1)
    assert queued["content"]["type"] == "thought" and queued["content"]["body"].startswith(
        "Queued for web-box"
    )
    assert "acme/web" in queued["content"]["body"]
    assert "confidence 0.92" in (note_of(api, on_backend["sessionId"]) or "")
    assert page_note(api, on_backend["sessionId"]) == note_of(api, on_backend["sessionId"])


def test_below_the_confidence_the_person_picks_and_the_pick_routes_the_start(
    api: Api, linear: Linear
) -> None:
    """Rule 3, an agent session: Linear gets a `select` elicitation listing the candidates; nothing
    is queued meanwhile, and a follow-up sent meanwhile waits; the person's pick (a `prompted` with
    the select signal) routes the start, and the follow-up follows it to that machine."""
    _, backend = machine(api, "backend-box", [BACKEND])
    _, web = machine(api, "web-box", [WEB])
    linear.suggestions["iss-unsure"] = {"acme/backend": 0.41, "acme/web": 0.39}
    api.webhook(agent_session_event(session_id="as-pick", issue_id="iss-unsure"))
    [asked] = wait_said(linear, "as-pick", 1)
    assert asked["content"] == {"type": "elicitation", "body": "Which repository should I work in?"}
    assert asked["signal"] == "select"
    assert [o["value"] for o in asked["signalMetadata"]["options"]] == ["acme/backend", "acme/web"]
    follow_up = agent_session_event(session_id="as-pick", action="prompted", body="also fix the docs")
    assert api.webhook(follow_up).json()["status"] == "routing"  # waits behind the start
    time.sleep(0.3)
    assert api.claim_all(backend) == [] and api.claim_all(web) == []
    pick = agent_session_event(session_id="as-pick", action="prompted", body="acme/web", signal="select")
    assert api.webhook(pick).json()["status"] == "routing"
    [start] = wait_claim(api, web)
    assert (start["kind"], start["repository"], start["agentSessionId"]) == ("start", WEB, "as-pick")
    ack(api, web, start)
    [prompt] = wait_claim(api, web)
    assert (prompt["kind"], prompt["prompt"]["body"]) == ("prompt", "also fix the docs")
    assert api.claim_all(backend) == []
    assert len(reads(linear, "issueRepositorySuggestions")) == 1  # the pick needed no second question
    assert "picked in Linear" in (note_of(api, start["sessionId"]) or "")
    # The follow-up's page says how its conversation's machine was chosen: the start's note.
    assert note_of(api, prompt["sessionId"]) is None
    assert page_note(api, prompt["sessionId"]) == note_of(api, start["sessionId"])


def test_a_pick_that_names_no_candidate_is_asked_again_and_a_stop_ends_the_wait(
    api: Api, linear: Linear
) -> None:
    machine(api, "backend-box", [BACKEND])
    machine(api, "web-box", [WEB])
    api.webhook(agent_session_event(session_id="as-again", issue_id="iss-none"))  # no suggestion at all
    wait_said(linear, "as-again", 1)
    api.webhook(
        agent_session_event(session_id="as-again", action="prompted", body="acme/mobile", signal="select")
    )
    again = wait_said(linear, "as-again", 2)[1]
    assert again["signal"] == "select" and "acme/mobile" in again["content"]["body"]
    stop = api.webhook(agent_session_event(session_id="as-again", action="prompted", signal="stop")).json()
    assert stop["status"] == "stopped" and stop["stopSessionId"] is None
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT outcome FROM routing_requests WHERE agent_session_id = 'as-again'"
        ).fetchone()
    assert row is not None and row["outcome"] == "cancelled"


def test_a_plain_assignment_takes_the_best_suggestion_and_says_so_first(api: Api, linear: Linear) -> None:
    """Rule 3, a plain assignment: no one to ask, so the best suggestion, even below the
    confidence. The session's page shows why, and so does the first activity of the agent session
    devpilot opens for the assignment once it is delivered (a workspace connected as the app):
    posted after Linear opened that agent session, before anything the agent says."""
    with api.pool.connection() as conn:  # connected as the app (its app user known, as OAuth learns it)
        conn.execute("UPDATE linear_credentials SET app_user_id = 'app-user' WHERE org_id = 'org-a'")
    _, backend = machine(api, "backend-box", [BACKEND])
    _, web = machine(api, "web-box", [WEB])
    linear.suggestions["iss-plain"] = {"acme/backend": 0.2, "acme/web": 0.55}
    api.webhook(issue_event(issue_id="iss-plain"))
    [m] = wait_claim(api, web)
    assert m["repository"] == WEB and api.claim_all(backend) == []
    assert linear.activities() == []  # nobody was asked
    note = note_of(api, m["sessionId"])
    assert note == (
        "acme/web: Linear's best suggestion (confidence 0.55, below 0.7; a plain assignment has no one to ask)"
    )
    page = api.http.get(f"/sessions/{m['sessionId']}", headers=api.admin()).text
    assert page_note(api, m["sessionId"]) == note and "Linear&#x27;s best suggestion" in page  # escaped
    ack(api, web, m)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not linear.activities():
        time.sleep(0.02)
    [opened] = reads(linear, "agentSessionCreateOnIssue")
    assert opened["input"]["issueId"] == "iss-plain"
    agent = next(iter(linear.sessions))
    [first] = said(linear, agent)
    assert first["content"] == {"type": "thought", "body": f"Picked up by web-box — {note}"}
    fields = [root_field(c) for c in linear.calls]
    assert fields.index("agentSessionCreateOnIssue") < fields.index("agentActivityCreate")

    def posted() -> list[Any]:  # (marked sent once Linear's answer is back, a moment after it)
        with api.pool.connection() as conn:
            return conn.execute(
                "SELECT id, sent_at FROM linear_notices WHERE kind = 'delivered' AND agent_session_id = %s",
                (agent,),
            ).fetchall()

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p["sent_at"] is None for p in posted()):
        time.sleep(0.02)
    rows = posted()  # one post, idempotent by its own id, sent once
    assert [str(p["id"]) for p in rows] == [first["id"]] and rows[0]["sent_at"] is not None


@pytest.mark.parametrize("why", ["linear_down", "not_connected"])
def test_linear_unreachable_or_not_connected_routes_as_before_and_says_so(
    api: Api, httpserver: HTTPServer, why: str
) -> None:
    """Rule 4: the start goes to the most recently seen machine, naming no repository, at once (no
    retry waits on Linear), and the session's page note says why."""
    linear = Linear(httpserver, fail=100 if why == "linear_down" else 0)
    if why == "linear_down":
        r = api.http.post(
            "/linear-credentials", json={"orgId": "org-a", "accessToken": "lin-test"}, headers=api.admin()
        )
        assert r.status_code == 200
    _, backend = machine(api, "backend-box", [BACKEND])
    _, web = machine(api, "web-box", [WEB])  # the most recently seen
    linear.suggestions["iss-down"] = {"acme/backend": 0.99}
    assert (
        api.webhook(agent_session_event(session_id="as-down", issue_id="iss-down")).json()["status"]
        == "routing"
    )
    [m] = wait_claim(api, web, timeout=5)
    assert m["repository"] is None and api.claim_all(backend) == []
    note = note_of(api, m["sessionId"]) or ""
    assert note.startswith("Linear could not be asked which repository"), note
    assert ("not connected" in note) == (why == "not_connected")
    assert page_note(api, m["sessionId"]) == note  # said on the session's page


def test_a_label_narrows_the_candidates(api: Api, linear: Linear) -> None:
    """An issue labelled like a machine label goes only to the machines with it: here one, with
    one repository, so Linear is not asked which; an issue without the label is routed by
    repository among all of them."""
    _, gpu = machine(api, "gpu-box", [BACKEND], labels=["gpu"])
    _, laptop = machine(api, "laptop", [BACKEND, WEB])  # the most recently seen
    linear.labels["iss-gpu"] = ["GPU", "bug"]
    linear.suggestions["iss-gpu"] = {"acme/web": 0.99}  # (never asked)
    linear.suggestions["iss-plain"] = {"acme/web": 0.99}
    api.webhook(issue_event(issue_id="iss-gpu"))
    [m] = wait_claim(api, gpu)
    assert m["repository"] == BACKEND and api.claim_all(laptop) == []
    assert "label gpu" in (note_of(api, m["sessionId"]) or "")
    assert reads(linear, "issueRepositorySuggestions") == []
    api.webhook(issue_event(issue_id="iss-plain"))
    [m] = wait_claim(api, laptop)
    assert m["repository"] == WEB
    assert [r["issueId"] for r in reads(linear, "issueRepositorySuggestions")] == ["iss-plain"]


def test_a_machine_without_the_repository_gives_the_start_back_and_it_is_routed_again(
    api: Api, linear: Linear
) -> None:
    """The machine's list changed since the start was routed: it releases the start with the
    reason `repository_missing`, and the start (with the follow-up queued behind it) is routed
    again, to a machine that has the repository; the machine no longer counts as having it."""
    _, other = machine(api, "workstation", [BACKEND, WEB])
    gone_id, gone = machine(api, "laptop", [BACKEND])  # the most recently seen with acme/backend
    linear.suggestions["iss-moved"] = {"acme/backend": 0.95}
    api.webhook(agent_session_event(session_id="as-moved", issue_id="iss-moved"))
    [start] = wait_claim(api, gone)
    assert start["repository"] == BACKEND
    api.webhook(agent_session_event(session_id="as-moved", action="prompted", body="and the tests"))
    r = api.post_as(
        gone,
        "/release",
        {
            "queueId": start["queueId"],
            "claimToken": start["claimToken"],
            "reason": "repository_missing: no checkout",
        },
    )
    assert r.status_code == 200 and r.json()["rerouted"] is True and r.json()["availableAt"] is None
    [again] = wait_claim(api, other)
    assert (again["kind"], again["repository"], again["issue"]["id"]) == ("start", BACKEND, "iss-moved")
    ack(api, other, again)
    [prompt] = wait_claim(api, other)
    assert (prompt["kind"], prompt["prompt"]["body"]) == ("prompt", "and the tests")
    assert api.claim_all(gone) == []
    listed = {
        o["orchestratorId"]: o
        for o in api.http.get("/orchestrators", headers=api.admin()).json()["orchestrators"]
    }
    assert listed[gone_id]["repositories"] == []
    with api.pool.connection() as conn:
        old = conn.execute(
            "SELECT status, failure_reason FROM dispatch_sessions WHERE id = %s", (start["sessionId"],)
        ).fetchone()
    assert old is not None and old["status"] == "cancelled" and "repository_missing" in old["failure_reason"]
    assert len(reads(linear, "issueRepositorySuggestions")) == 1  # routed again without asking again


# --- concurrency -------------------------------------------------------------------------------------


def test_200_starts_for_two_machines_are_each_routed_once_and_claimed_once(api: Api, linear: Linear) -> None:
    """200 starts at once for one user with two machines (and sweeps running meanwhile, which
    route due requests too): every start becomes exactly one session on the machine with its
    repository, Linear is asked once per start, and every message is claimed exactly once by
    concurrent claimers."""
    n = 200
    _, backend = machine(api, "backend-box", [BACKEND])
    _, web = machine(api, "web-box", [WEB])
    for i in range(n):
        linear.suggestions[f"iss-c{i}"] = {"acme/backend" if i % 2 else "acme/web": 0.9}
    events = [
        agent_session_event(session_id=f"as-c{i}", issue_id=f"iss-c{i}")
        if i % 4 == 0
        else issue_event(issue_id=f"iss-c{i}")
        for i in range(n)
    ]
    stop = threading.Event()

    def sweeping() -> None:
        while not stop.is_set():
            api.http.post("/sweep", headers=api.admin())

    sweeper = threading.Thread(target=sweeping)
    sweeper.start()
    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda e: api.webhook(e).json()["status"], events))
        assert answers == ["routing"] * n
        claimed: dict[str, list[dict[str, Any]]] = {"backend": [], "web": []}
        lock = threading.Lock()

        def claimer(name: str, token: str) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(len(v) for v in claimed.values()) < n:
                got = api.claim_all(token)
                with lock:
                    claimed[name] += got
                if not got:
                    time.sleep(0.05)

        with ThreadPoolExecutor(6) as pool:
            for f in [
                pool.submit(claimer, name, tok) for name, tok in [("backend", backend), ("web", web)] * 3
            ]:
                f.result()
    finally:
        stop.set()
        sweeper.join()
    ids = [m["queueId"] for v in claimed.values() for m in v]
    assert len(ids) == n == len(set(ids))  # each claimed once
    assert {int(m["issue"]["id"][5:]) % 2 for m in claimed["backend"]} == {1}
    assert {int(m["issue"]["id"][5:]) % 2 for m in claimed["web"]} == {0}
    assert all(
        m["repository"] == (BACKEND if int(m["issue"]["id"][5:]) % 2 else WEB)
        for v in claimed.values()
        for m in v
    )
    asked = [r["issueId"] for r in reads(linear, "issueRepositorySuggestions")]
    assert len(asked) == n == len(set(asked))  # each routed once
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS requests, count(DISTINCT session_id) AS sessions,"
            " count(*) FILTER (WHERE outcome = 'dispatched') AS dispatched,"
            " (SELECT count(*) FROM dispatch_sessions) AS all_sessions FROM routing_requests"
        ).fetchone()
    assert row == {"requests": n, "sessions": n, "dispatched": n, "all_sessions": n}
    assert [root_field(c) for c in linear.calls].count("issue") == 0  # (no label, no assignee to read)
