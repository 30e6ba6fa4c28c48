"""What the cheaper request path (#17: fewer round trips per request) must still guarantee.

- The pool lends a connection without pinging it first, yet a connection the server has ended
  (pg_terminate_backend, a restart) is never lent: the next request answers 200, not 503.
- Authentication records that the machine was seen, in the same statement, at most once a second,
  and never for a revoked token.
- An issue created with an assignee is taken in one round trip, and writes and answers what the
  intake transaction would; so is an event that does nothing (its delivery alone is recorded).
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import psycopg
import pytest
from psycopg.pq import Format

from functions.app import wsgi
from shared.delivery import intake
from shared.delivery.queue import UNROUTABLE, claim, revoke
from shared.fleet.orchestrators import register
from shared.linear import webhooks as linear
from shared.linear.auth import store_static
from shared.plumbing.db import JsonbLoader, Pool, open_pool, transaction
from shared.plumbing.settings import Settings
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.data import ENCRYPTION_KEY

T = TypeVar("T")


def _terminate_all_but_me(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as killer:
        rows = killer.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()
    return len(rows)


def test_a_connection_the_server_ended_is_never_lent(db_url: str, settings: Settings) -> None:
    pool: Pool = open_pool(db_url, settings, min_size=3, max_size=3)
    try:
        pool.wait()
        before = set()
        for _ in range(3):
            with transaction(pool) as tx:
                row = tx.one("SELECT pg_backend_pid() AS pid")
                assert row is not None
                before.add(row["pid"])
        assert _terminate_all_but_me(db_url) >= 1
        time.sleep(0.3)  # the server's goodbye reaches the idle sockets
        for _ in range(6):  # every idle connection was ended; each checkout must get a live one
            with transaction(pool) as tx:
                row = tx.one("SELECT pg_backend_pid() AS pid")
                assert row is not None and row["pid"] not in before
    finally:
        pool.close()


JSON_VALUES = [
    {"a": [1, 2.5, -7.25e-5, 12345678901234567890, True, None], "é": "日本語 \u2028 \ud83d\ude00"},
    [],
    "",
    0,
    {"nested": {"deep": [{"x": '\\"quoted"'}]}, "": {}},
]


def test_the_pools_jsonb_reads_as_json_loads_of_the_same_text(db_url: str, settings: Settings) -> None:
    """The pool's connections read `jsonb` with their own loader (shared.plumbing.db.JsonbLoader, cheaper than
    psycopg's): every value as `json.loads` reads Postgres's text of it, non-ASCII included."""
    pool: Pool = open_pool(db_url, settings, max_size=1)
    try:
        with pool.connection() as conn:
            assert conn.adapters.get_loader(conn.adapters.types["jsonb"].oid, Format.TEXT) is JsonbLoader
        with transaction(pool) as tx:
            for value in JSON_VALUES:
                row = tx.one(
                    "SELECT %(v)s::jsonb AS parsed, %(v)s::jsonb::text AS text", {"v": json.dumps(value)}
                )
                assert row is not None
                assert row["parsed"] == json.loads(row["text"]) and type(row["parsed"]) is type(value)
            row = tx.one("SELECT NULL::jsonb AS parsed")
            assert row is not None and row["parsed"] is None
    finally:
        pool.close()


def test_serve_answers_200_right_after_its_connections_were_terminated(api: Api, db_url: str) -> None:
    for _ in range(5):
        assert api.http.get("/healthz").status_code == 200
    assert _terminate_all_but_me(db_url) >= 1
    time.sleep(0.3)
    assert [api.http.get("/healthz").status_code for _ in range(10)] == [200] * 10


def _last_seen(api: Api, oid: str) -> datetime | None:
    with api.pool.connection() as conn:
        row = conn.execute("SELECT last_seen_at FROM orchestrators WHERE id = %s", (UUID(oid),)).fetchone()
    assert row is not None
    value: datetime | None = row["last_seen_at"]
    return value


def _set_seen_long_ago(api: Api, oid: str) -> None:
    with api.pool.connection() as conn:
        conn.execute(
            "UPDATE orchestrators SET last_seen_at = now() - interval '1 hour' WHERE id = %s", (UUID(oid),)
        )


def test_any_authenticated_call_marks_the_machine_seen_at_most_once_a_second(api: Api) -> None:
    oid, token = api.register()
    _set_seen_long_ago(api, oid)
    old = _last_seen(api, oid)
    ack = api.post_as(token, "/ack", {"queueId": str(UUID(int=1)), "claimToken": str(UUID(int=2))})
    assert ack.status_code < 500
    first = _last_seen(api, oid)
    assert old is not None and first is not None and (first - old).total_seconds() > 3000  # an ack counts
    assert api.post_as(token, "/claim").status_code == 200
    assert _last_seen(api, oid) == first  # within the second: a read, no write
    time.sleep(1.1)
    assert api.post_as(token, "/claim").status_code == 200
    later = _last_seen(api, oid)
    assert later is not None and later > first


def test_a_revoked_or_unknown_token_marks_nothing_seen(api: Api) -> None:
    oid, token = api.register()
    other_id, other = api.register(user="someone-else")
    assert api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin()).status_code == 200
    _set_seen_long_ago(api, oid)
    _set_seen_long_ago(api, other_id)
    before = (_last_seen(api, oid), _last_seen(api, other_id))
    assert api.post_as(token, "/claim").status_code == 401
    assert api.post_as(other + "x", "/claim").status_code == 401
    assert (_last_seen(api, oid), _last_seen(api, other_id)) == before


def test_a_poll_by_a_revoked_machine_claims_nothing_and_hears_401(api: Api) -> None:
    """The poll route authenticates in its claim statement: a machine revoked a moment ago (its rows
    not yet moved, as if the revoke committed during the poll) gets 401 and its work stays unclaimed."""
    oid, token = api.register()
    api.webhook(issue_event(issue_id="rev-poll"))
    with api.pool.connection() as conn:
        conn.execute("UPDATE orchestrators SET revoked_at = now() WHERE id = %s", (UUID(oid),))
    r = api.post_as(token, "/claim", {"max": 10})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    with api.pool.connection() as conn:
        row = conn.execute("SELECT attempts, claim_token FROM dispatch_queue").fetchone()
    assert row is not None and row["attempts"] == 0 and row["claim_token"] is None


@pytest.mark.parametrize(
    ("path", "bad_body"),
    [("/claim", {"max": "lots"}), ("/ack", {"queueId": 7}), ("/ack", {"acks": [], "queueId": "x"})],
)
def test_a_wrong_token_hears_401_before_its_body_is_judged(api: Api, path: str, bad_body: object) -> None:
    _, token = api.register()
    assert api.post_as(token + "x", path, bad_body).status_code == 401
    assert api.post_as(token, path, bad_body).status_code == 400
    assert api.http.post(path, json={}).status_code == 401  # no token at all


def test_an_ack_by_a_revoked_machine_acks_nothing_and_hears_401(api: Api) -> None:
    """The ack authenticates in its ack statement: a machine revoked a moment ago (its rows not yet
    moved, as if the revoke committed during the ack) gets 401, and its row stays claimed."""
    oid, token = api.register()
    api.webhook(issue_event(issue_id="rev-ack"))
    [m] = api.post_as(token, "/claim", {"max": 10}).json()["messages"]
    with api.pool.connection() as conn:
        conn.execute("UPDATE orchestrators SET revoked_at = now() WHERE id = %s", (UUID(oid),))
    for body in ({"queueId": m["queueId"], "claimToken": m["claimToken"]}, {"acks": [m]}):
        r = api.post_as(token, "/ack", body)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT s.status FROM dispatch_queue q JOIN dispatch_sessions s ON s.id = q.session_id"
        ).fetchone()
    assert row is not None and row["status"] == "queued"


def test_a_poll_answers_the_callers_own_work_only(api: Api) -> None:
    mine_id, mine = api.register(user="user-1")
    _, other = api.register(user="user-2")
    sent = api.webhook(issue_event(issue_id="own-1")).json()
    assert api.post_as(other, "/claim", {"max": 10}).json()["messages"] == []
    [m] = api.post_as(mine, "/claim", {"max": 10}).json()["messages"]
    assert m["messageId"] == sent["messageId"] and m["orchestratorId"] == mine_id


@pytest.mark.parametrize(
    "api_overrides", [{}, {"DEVPILOT_LOG_EMPTY_POLLS": True}], ids=["default", "every-poll"]
)
def test_each_poll_is_logged_with_the_machine_that_made_it(
    api: Api, api_overrides: dict[str, object], caplog: pytest.LogCaptureFixture
) -> None:
    """Operators tell machines apart in the request log: the poll route learns who is calling in
    its one statement, and its log line names that machine. An empty poll's line is a debug line
    unless DEVPILOT_LOG_EMPTY_POLLS is set (an idle fleet's polls are most of its log bill); a poll
    that claims something, and every other request, is an info line."""
    caplog.set_level(logging.DEBUG, logger="devpilot.request")
    mine, token = api.register()
    other, other_token = api.register(user="user-2", name="desktop")
    api.webhook(issue_event())
    for t in (token, other_token, token):  # mine claims the work, then the other and mine poll empty
        assert api.post_as(t, "/claim").status_code == 200
    assert api.post_as(token, "/claim", {"waitSeconds": 1}).json() == {"messages": []}  # a long-poll too
    assert api.post_as("dpo_wrong", "/claim").status_code == 401
    nothing = {"queueId": str(UUID(int=1)), "claimToken": str(UUID(int=2))}
    for t in (other_token, token):  # and so does the ack, which learns it in its one statement too
        assert api.post_as(t, "/ack", nothing).status_code == 404
    # (a request line is logged as "%s" with its fields as the one mapping argument)
    lines = [(r.levelno, r.args) for r in caplog.records if isinstance(r.args, dict)]
    polls = [
        (level, line.get("orchestratorId"), line["status"])
        for level, line in lines
        if line["route"] == "claim"
    ]
    empty = logging.INFO if api_overrides else logging.DEBUG
    assert polls == [
        (logging.INFO, mine, 200),
        (empty, other, 200),
        (empty, mine, 200),
        (empty, mine, 200),
        (logging.INFO, None, 401),
    ]
    acks = [(level, line.get("orchestratorId")) for level, line in lines if line["route"] == "ack"]
    assert acks == [(logging.INFO, other), (logging.INFO, mine)]


def test_the_served_app_hands_back_each_body_whole_and_a_head_none(api: Api) -> None:
    """`devpilot serve`'s WSGI app returns a body it holds as a list of bytes: Granian sends a list
    in one piece, while any other iterable costs thread hand-offs per request (bench: server CPU
    per empty claim 0.475 -> 0.428 ms). A HEAD still gets its headers and no body."""
    _, token = api.register()
    answers: list[tuple[str, dict[str, str]]] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
        answers.append((status, dict(headers)))

    def call(method: str, path: str, body: bytes = b"", **headers: str) -> Iterable[bytes]:
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8080",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "CONTENT_LENGTH": str(len(body)),
            **{f"HTTP_{k.upper()}": v for k, v in headers.items()},
        }
        return wsgi(environ, start_response)  # type: ignore[arg-type]

    got = call("POST", "/claim", b'{"max": 1}', authorization=f"Bearer {token}")
    assert isinstance(got, list) and len(got) == 1
    assert answers[-1][0].startswith("200") and json.loads(got[0]) == {"messages": []}
    got = call("GET", "/healthz")
    assert isinstance(got, list) and json.loads(b"".join(got)) == {"ok": True}
    got = call("HEAD", "/healthz")
    assert got == [] and answers[-1][0].startswith("200")
    assert int(answers[-1][1]["Content-Length"]) == len(b'{"ok":true}')


def _round_trips(pool: Pool, run: Callable[[], T]) -> tuple[T, int]:
    """`run()`'s answer and how many round trips its pool's one connection made, counted in libpq's
    own trace of the connection's messages: each time the client, having sent, reads the server's
    answer. (Not only ReadyForQuery: in a pipeline, `shared.plumbing.db.together`, a read before the commit
    waits for the server after a Flush, and only the last answer ends with ReadyForQuery.)"""
    conn = pool.getconn()
    pool.putconn(conn)
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            answer = run()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        trips, sent = 0, False
        for line in trace:  # (lines of a message's text, which a statement's may span, are skipped)
            way = line.split("\t", 1)[0]
            if way == "F":
                sent = True
            elif way == "B" and sent:
                trips, sent = trips + 1, False
        return answer, trips


def _receive(pool: Pool, event: dict[str, Any], delivery: str) -> dict[str, Any]:
    return intake.receive(pool, linear.parse(json.dumps(event).encode()), delivery).answer


def _written(pool: Pool) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            "SELECT d.delivery_key, d.outcome, d.session_id, s.status, s.kind, s.issue_id, s.linear_user_id,"
            " s.orchestrator_id, s.queue_id, q.id AS queue_row FROM webhook_deliveries d"
            " LEFT JOIN dispatch_sessions s ON s.id = d.session_id LEFT JOIN dispatch_queue q ON q.session_id = s.id"
            " ORDER BY d.received_at"
        ).fetchall()


def _told(pool: Pool, agent_session_id: str) -> list[dict[str, Any]]:
    """What Linear is to be told about an agent session (its notices, oldest first)."""
    with pool.connection() as conn:
        return conn.execute(
            "SELECT kind, body FROM linear_notices WHERE agent_session_id = %s ORDER BY seq",
            (agent_session_id,),
        ).fetchall()


def test_an_issue_created_with_an_assignee_is_taken_in_one_round_trip(
    db_url: str, settings: Settings
) -> None:
    """The plain case of the intake, an issue created with an assignee, is one statement that is
    its own transaction: the delivery, the routing choice, the session and its queue row in one
    round trip where the intake transaction takes four (BEGIN, record and route, enqueue, COMMIT).
    It writes what that transaction writes, answers the same, and a second copy is a duplicate."""
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        machine = register(pool, org_id="org-a", linear_user_id="user-1", name="laptop")
        event = issue_event(issue_id="iss-once", assignee="user-1")
        answer, trips = _round_trips(pool, lambda: _receive(pool, event, "d-1"))
        assert trips == 1
        assert answer == {
            "status": "dispatched",
            "sessionId": answer["sessionId"],
            "queueId": answer["queueId"],
            "messageId": answer["messageId"],
            "orchestratorId": str(machine.id),
        }
        [row] = _written(pool)
        assert row == {
            "delivery_key": "delivery:d-1",
            "outcome": "dispatched",
            "session_id": UUID(answer["sessionId"]),
            "status": "queued",
            "kind": "start",
            "issue_id": "iss-once",
            "linear_user_id": "user-1",
            "orchestrator_id": machine.id,
            "queue_id": UUID(answer["queueId"]),
            "queue_row": UUID(answer["queueId"]),
        }
        [message] = claim(pool, machine.id, max=10, lease_seconds=60)
        assert str(message.message_id) == answer["messageId"] and message.issue.id == "iss-once"
        # Linear's retry of the delivery, and the same change under another delivery id.
        assert _receive(pool, event, "d-1") == {"status": "duplicate", "sessionId": answer["sessionId"]}
        assert _receive(pool, event, "d-2") == {"status": "duplicate", "sessionId": answer["sessionId"]}
        assert len(_written(pool)) == 1
    finally:
        pool.close()


def test_an_existing_issue_assigned_is_one_round_trip_and_a_reassignment_two(
    db_url: str, settings: Settings
) -> None:
    """Most assignments in a workspace are an existing issue assigned (`updatedFrom.assigneeId`):
    with nothing of the issue undelivered, the same one statement as a creation (one round trip).
    Re-assigned while its start is undelivered: its transaction, its statements sent together (the
    delivery with the issue's turn, the cancel, the enqueue), read, then committed, cancels that
    start and dispatches to the new assignee: two round trips."""
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        laptop = register(pool, org_id="org-a", linear_user_id="user-1", name="laptop")
        desk = register(pool, org_id="org-a", linear_user_id="user-2", name="desk")
        event = issue_event(
            "update", issue_id="iss-old", assignee="user-1", updated_from={"assigneeId": None}
        )
        answer, trips = _round_trips(pool, lambda: _receive(pool, event, "d-1"))
        assert trips == 1 and answer["status"] == "dispatched" and "cancelledSessionId" not in answer
        assert answer["orchestratorId"] == str(laptop.id)
        again = issue_event(
            "update", issue_id="iss-old", assignee="user-2", updated_from={"assigneeId": "user-1"}
        )
        moved, trips = _round_trips(pool, lambda: _receive(pool, again, "d-2"))
        assert trips == 1  # its statements sent together, the commit with them
        assert moved["status"] == "dispatched" and moved["orchestratorId"] == str(desk.id)
        assert moved["cancelledSessionId"] == answer["sessionId"]
        assert claim(pool, laptop.id, max=10, lease_seconds=60) == []
        [message] = claim(pool, desk.id, max=10, lease_seconds=60)
        assert str(message.message_id) == moved["messageId"]
        # Delivered: re-assigned, there is nothing to cancel: its statements read, then the commit.
        from shared.delivery.queue import AckItem, ack_many

        assert ack_many(pool, desk.id, [AckItem(message.queue_id, message.claim_token)]).statuses == ["acked"]
        third = issue_event(
            "update", issue_id="iss-old", assignee="user-1", updated_from={"assigneeId": "user-2"}
        )
        answer, trips = _round_trips(pool, lambda: _receive(pool, third, "d-3"))
        assert (trips, answer["status"], answer["orchestratorId"]) == (1, "dispatched", str(laptop.id))
        assert "cancelledSessionId" not in answer
        # Re-assigned to someone whose machines differ in what they have: the start waits for
        # Linear to name its repository (a routing request), written by the same one round trip.
        one = register(pool, org_id="org-a", linear_user_id="user-3", name="one")
        two = register(pool, org_id="org-a", linear_user_id="user-3", name="two")
        with pool.connection() as conn:
            conn.execute("UPDATE orchestrators SET routing_shape = 'elsewhere' WHERE id = %s", (two.id,))
        fourth = issue_event(
            "update", issue_id="iss-old", assignee="user-3", updated_from={"assigneeId": "user-1"}
        )
        asked, trips = _round_trips(pool, lambda: _receive(pool, fourth, "d-4"))
        assert trips == 1
        assert asked == {
            "status": "routing",
            "routeId": asked["routeId"],
            "cancelledSessionId": answer["sessionId"],
        }
        with pool.connection() as conn:
            request = conn.execute(
                "SELECT need, linear_user_id, delivery_key, message->>'kind' AS kind, issue_id"
                " FROM routing_requests WHERE id = %s",
                (asked["routeId"],),
            ).fetchone()
        assert request == {
            "need": "repository",
            "linear_user_id": "user-3",
            "delivery_key": "delivery:d-4",
            "kind": "start",
            "issue_id": "iss-old",
        }
        assert [(r["outcome"], r["session_id"]) for r in _written(pool)][-1] == ("routing", None)
        assert (
            claim(pool, one.id, max=10, lease_seconds=60)
            == claim(pool, two.id, max=10, lease_seconds=60)
            == []
        )
    finally:
        pool.close()


def test_an_issue_for_someone_without_a_machine_is_ignored_in_one_round_trip(
    db_url: str, settings: Settings
) -> None:
    """Most assignments in a workspace go to people without a machine: recorded as ignored (so a
    retry is a duplicate), nothing queued, in the one statement."""
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        register(pool, org_id="org-a", linear_user_id="someone-else", name="laptop")
        event = issue_event(issue_id="iss-nobody", assignee="user-1")
        answer, trips = _round_trips(pool, lambda: _receive(pool, event, "d-1"))
        assert (answer, trips) == ({"status": "ignored", "reason": "no_orchestrator"}, 1)
        [row] = _written(pool)
        assert (row["outcome"], row["session_id"], row["status"]) == ("ignored", None, None)
        assert _receive(pool, event, "d-1") == {"status": "duplicate", "sessionId": None}
    finally:
        pool.close()


def test_an_event_that_does_nothing_is_recorded_in_one_round_trip(db_url: str) -> None:
    """Linear sends an update for every change to an issue; most change nothing here (an issue
    edited, its assignee the same). Its delivery alone is recorded, as ignored, in one statement
    that is its own transaction, so a retry, or the same change through another webhook, is a
    duplicate. An agent session that nothing can take is not one of them: Linear hears why, in
    the intake transaction."""
    settings = Settings(DATABASE_URL=None, DEVPILOT_ENCRYPTION_KEYS=ENCRYPTION_KEY)
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        store_static(pool, settings, "org-a", "lin_api_test")  # an org Linear is told about
        laptop = register(pool, org_id="org-a", linear_user_id="user-1", name="laptop")
        edited = issue_event("update", issue_id="iss-edit", assignee="user-1", updated_from={"title": "old"})
        answer, trips = _round_trips(pool, lambda: _receive(pool, edited, "d-1"))
        assert (answer, trips) == ({"status": "ignored", "reason": "assignee_unchanged"}, 1)
        [row] = _written(pool)
        assert (row["delivery_key"], row["outcome"], row["session_id"]) == ("delivery:d-1", "ignored", None)
        assert _receive(pool, edited, "d-1") == {"status": "duplicate", "sessionId": None}
        assert _receive(pool, edited, "d-2") == {"status": "duplicate", "sessionId": None}
        assert len(_written(pool)) == 1
        assert claim(pool, laptop.id, max=10, lease_seconds=60) == []  # nothing queued for the assignee

        unhandled = {**issue_event(issue_id="iss-x"), "type": "Comment", "action": "create"}
        answer, trips = _round_trips(pool, lambda: _receive(pool, unhandled, "d-3"))
        assert (answer, trips) == ({"status": "ignored", "reason": "unhandled_type:Comment"}, 1)

        nothing_can_take = agent_session_event(session_id="as-no-issue", creator="user-1")
        del nothing_can_take["agentSession"]["issue"]
        answer, trips = _round_trips(pool, lambda: _receive(pool, nothing_can_take, "d-4"))
        assert answer == {"status": "ignored", "reason": "agent_session_without_issue"}
        assert trips > 1  # the intake transaction, which also writes Linear's notice
        assert _told(pool, "as-no-issue") == [{"kind": "failed", "body": UNROUTABLE}]
    finally:
        pool.close()


def test_a_stop_is_one_round_trip(db_url: str) -> None:
    """Linear's stop is one transaction sent at once: the delivery with the agent session's turn,
    the cancel of what no machine has yet, the stop recorded, and either a `stop` for the machine
    that had a message delivered or Linear's final response, each reading the delivery's verdict in
    SQL. One round trip, answering and writing what the intake transaction did; a retry of it is a
    duplicate that cancels, queues and tells nothing."""
    settings = Settings(DATABASE_URL=None, DEVPILOT_ENCRYPTION_KEYS=ENCRYPTION_KEY)
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        store_static(pool, settings, "org-a", "lin_api_test")  # an org Linear is told about
        laptop = register(pool, org_id="org-a", linear_user_id="user-1", name="laptop")
        # Nobody has it yet: its queued start is cancelled, and Linear hears that nothing started.
        queued = _receive(pool, agent_session_event(session_id="as-queued"), "d-1")
        stop = agent_session_event(action="prompted", session_id="as-queued", signal="stop")
        answer, trips = _round_trips(pool, lambda: _receive(pool, stop, "d-2"))
        assert trips == 1
        assert answer == {
            "status": "stopped",
            "cancelledSessionIds": [queued["sessionId"]],
            "stopSessionId": None,
        }
        assert _told(pool, "as-queued")[-1] == {"kind": "stopped", "body": intake.STOPPED_BEFORE_START}
        assert claim(pool, laptop.id, max=10, lease_seconds=60) == []
        assert [r["outcome"] for r in _written(pool)] == ["dispatched", "stopped"]
        assert _receive(pool, stop, "d-2") == {"status": "duplicate", "sessionId": None}
        assert len(_told(pool, "as-queued")) == 2  # the queued thought and the one final response

        # Delivered to the laptop, and a follow-up queued behind it: the follow-up is cancelled and
        # the laptop gets a `stop`, naming the holder's issue when the webhook names none.
        started = _receive(pool, agent_session_event(session_id="as-held"), "d-3")
        [start] = claim(pool, laptop.id, max=10, lease_seconds=60)
        from shared.delivery.queue import AckItem, ack_many

        assert ack_many(pool, laptop.id, [AckItem(start.queue_id, start.claim_token)]).statuses == ["acked"]
        follow = _receive(
            pool, agent_session_event(action="prompted", session_id="as-held", body="more"), "d-4"
        )
        assert follow["status"] == "dispatched"
        stop = agent_session_event(action="prompted", session_id="as-held", signal="stop")
        del stop["agentSession"]["issue"]
        told = len(_told(pool, "as-held"))
        answer, trips = _round_trips(pool, lambda: _receive(pool, stop, "d-5"))
        assert trips == 1
        assert answer["status"] == "stopped" and answer["cancelledSessionIds"] == [follow["sessionId"]]
        assert answer["stopSessionId"] not in (None, started["sessionId"])
        assert len(_told(pool, "as-held")) == told  # the machine says it stopped, not this
        with pool.connection() as conn:
            sent = conn.execute(
                "SELECT s.kind, s.orchestrator_id, s.issue_id, s.issue_identifier, q.payload"
                " FROM dispatch_sessions s JOIN dispatch_queue q ON q.session_id = s.id WHERE s.id = %s",
                (answer["stopSessionId"],),
            ).fetchone()
        assert sent is not None
        assert (sent["kind"], sent["orchestrator_id"]) == ("stop", laptop.id)
        assert (sent["issue_id"], sent["issue_identifier"]) == ("issue-as", "ENG-7")
        assert sent["payload"]["kind"] == "stop" and sent["payload"]["agentSessionId"] == "as-held"
        assert sent["payload"]["issue"] == {
            "id": "issue-as",
            "identifier": "ENG-7",
            "title": None,
            "url": None,
            "description": None,
        }
        # Written after the stop, a follow-up is queued; Linear's retry of the stop then cancels,
        # queues and records nothing.
        after = agent_session_event(action="prompted", session_id="as-held", body="go on")
        later = _receive(pool, after, "d-6")
        assert later["status"] == "dispatched"
        assert _receive(pool, stop, "d-5") == {"status": "duplicate", "sessionId": None}
        with pool.connection() as conn:
            stops = conn.execute("SELECT count(*) AS n FROM dispatch_sessions WHERE kind = 'stop'").fetchone()
            still = conn.execute(
                "SELECT status FROM dispatch_sessions WHERE id = %s", (later["sessionId"],)
            ).fetchone()
        assert stops is not None and stops["n"] == 1
        assert still is not None and still["status"] == "queued"
    finally:
        pool.close()


def test_a_machine_revoked_before_the_statement_is_never_chosen(db_url: str, settings: Settings) -> None:
    """The one statement chooses among active machines only; a user whose only machine is revoked
    has none, and the work goes nowhere rather than to a machine that can never claim it."""
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=2)
    try:
        gone = register(pool, org_id="org-a", linear_user_id="user-1", name="old")
        assert revoke(pool, gone.id) is not None
        answer = _receive(pool, issue_event(issue_id="iss-revoked", assignee="user-1"), "d-1")
        assert answer == {"status": "ignored", "reason": "no_orchestrator"}
        stays = register(pool, org_id="org-a", linear_user_id="user-1", name="new")
        answer = _receive(pool, issue_event(issue_id="iss-revoked-2", assignee="user-1"), "d-2")
        assert answer["status"] == "dispatched" and answer["orchestratorId"] == str(stays.id)
    finally:
        pool.close()


def test_an_agent_sessions_start_is_taken_in_one_round_trip(db_url: str) -> None:
    """An agent session `created` is the same one statement: its turn taken, the start queued and
    Linear's "Queued for <machine>" thought written with it (posted after the commit), in one
    round trip. For a user without a machine it writes nothing and the transaction decides, which
    tells Linear why."""
    settings = Settings(DATABASE_URL=None, DEVPILOT_ENCRYPTION_KEYS=ENCRYPTION_KEY)
    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        machine = register(pool, org_id="org-a", linear_user_id="user-1", name="laptop")
        store_static(pool, settings, "org-a", "lin_api_test")  # an org Linear is told about
        event = agent_session_event(session_id="as-once", creator="user-1")
        received, trips = _round_trips(
            pool, lambda: intake.receive(pool, linear.parse(json.dumps(event).encode()), "d-1")
        )
        assert trips == 1
        answer = received.answer
        assert answer["status"] == "dispatched" and answer["kind"] == "start"
        assert answer["orchestratorId"] == str(machine.id)
        with pool.connection() as conn:
            notices = conn.execute(
                "SELECT id, session_id, agent_session_id, content FROM linear_notices"
            ).fetchall()
        assert [(n["session_id"], n["agent_session_id"], n["content"]) for n in notices] == [
            (UUID(answer["sessionId"]), "as-once", {"type": "thought", "body": "Queued for laptop"})
        ]
        assert received.notice_ids == [notices[0]["id"]]  # posted after the commit
        [message] = claim(pool, machine.id, max=10, lease_seconds=60)
        assert message.agent_session_id == "as-once" and message.kind == "start"
        assert message.prompt is not None and message.prompt.context == event["promptContext"]
        assert message.prompt.body is None  # a delegation: the root comment is Linear's placeholder

        nobody = agent_session_event(session_id="as-nobody", creator="user-without-machine")
        _, trips = _round_trips(pool, lambda: _receive(pool, nobody, "d-2"))
        assert trips == 1  # the one statement recorded it and told Linear
        assert _told(pool, "as-nobody") == [{"kind": "failed", "body": UNROUTABLE}]
    finally:
        pool.close()


def test_a_user_whose_machines_are_alike_stays_on_the_one_statement(db_url: str, settings: Settings) -> None:
    """Routing by repository costs the webhook nothing while a user's machines have the same
    repositories (one machine, or several alike): the start is still one round trip, to the most
    recently seen machine. Once they differ, the same one statement writes a routing request (need
    `repository`) with the delivery, answered `routing`; the webhook itself never asks Linear (the
    stand-in is not even there)."""
    from shared.fleet.machines import describe
    from shared.wire.messages import Repository

    pool: Pool = open_pool(db_url, settings, min_size=1, max_size=1)
    try:
        backend, web = Repository("github.com", "acme/backend"), Repository("github.com", "acme/web")
        laptop = register(pool, org_id="org-a", linear_user_id="user-1", name="laptop")
        describe(pool, laptop.id, [backend, web], [])
        answer, trips = _round_trips(pool, lambda: _receive(pool, issue_event(issue_id="iss-1"), "d-1"))
        assert (answer["status"], answer["orchestratorId"], trips) == ("dispatched", str(laptop.id), 1)
        box = register(pool, org_id="org-a", linear_user_id="user-1", name="box")
        describe(pool, box.id, [web, backend], [])
        with pool.connection() as conn:  # the box is the most recently seen
            conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (box.id,))
        answer, trips = _round_trips(pool, lambda: _receive(pool, issue_event(issue_id="iss-2"), "d-2"))
        assert (answer["status"], answer["orchestratorId"], trips) == ("dispatched", str(box.id), 1)

        describe(pool, box.id, [backend], [])  # now they differ
        event = issue_event(issue_id="iss-3")
        answer, trips = _round_trips(pool, lambda: _receive(pool, event, "d-3"))
        assert answer == {"status": "routing", "routeId": answer["routeId"]} and trips == 1
        with pool.connection() as conn:
            request = conn.execute(
                "SELECT need, linear_user_id, issue_id, done_at, delivery_key FROM routing_requests"
            ).fetchone()
            sessions = conn.execute("SELECT count(*) AS n FROM dispatch_sessions").fetchone()
        assert request == {
            "need": "repository",
            "linear_user_id": "user-1",
            "issue_id": "iss-3",
            "done_at": None,
            "delivery_key": "delivery:d-3",
        }
        assert sessions == {"n": 2}
        assert _receive(pool, event, "d-3") == {"status": "duplicate", "sessionId": None}
    finally:
        pool.close()


def test_the_request_line_of_an_error_names_its_code(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """A wrong LINEAR_WEBHOOK_SECRET and a stale timestamp are both 401s: the line of each names the
    error it answered, as does every other 4xx."""
    caplog.set_level(logging.INFO, logger="devpilot.request")
    _, token = api.register()
    assert api.webhook(issue_event(), secret="not-the-secret").status_code == 401
    assert api.webhook(issue_event(ts=1)).status_code == 401
    nothing = {"queueId": str(UUID(int=1)), "claimToken": str(UUID(int=2))}
    assert api.post_as(token, "/ack", nothing).status_code == 404
    assert api.post_as(token, "/ack", {"queueId": 5}).status_code == 400
    assert api.http.get("/nowhere").status_code == 404
    assert api.webhook(issue_event()).status_code == 200
    lines = [r.args for r in caplog.records if isinstance(r.args, dict)]
    assert [(line["route"], line["status"], line.get("error")) for line in lines] == [
        ("orchestrators", 201, None),
        ("webhook", 401, "bad_signature"),
        ("webhook", 401, "stale_webhook"),
        ("ack", 404, "not_found"),
        ("ack", 400, "bad_request"),
        ("-", 404, "not_found"),
        ("webhook", 200, None),
    ]
