"""`python -m bench.floor`'s floor server (bench/README, "Where the time goes"): a real Granian
process that writes a signed `created` webhook through the product's own intake statement, so that
what it measures beside `devpilot serve` is the same work; a wrong signature writes nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from bench.floor import Floor, machine
from bench.loadgen import USER_A, Connection, bodies, check
from shared.linear.webhooks import sign

SECRET = "floor-secret"


@pytest.fixture
def floor(db_url: str) -> Iterator[Floor]:
    machine(db_url, USER_A)
    f = Floor(db_url, SECRET)
    yield f
    f.close()


def _post(f: Floor, body: bytes, secret: str) -> tuple[int, bytes]:
    conn = Connection("127.0.0.1", f.port)
    try:
        headers = {"Linear-Signature": sign(secret, body), "Linear-Delivery": uuid.uuid4().hex}
        return conn.post("/webhook", body, headers)
    finally:
        conn.close()


def test_a_created_webhook_is_dispatched_through_the_products_statement(floor: Floor, db_url: str) -> None:
    _, body = bodies("created", "t", 0, 1, 1.0)()
    status, answer = _post(floor, body, SECRET)
    check("created", status, answer)  # (the load generator's own check of the answer)
    session = json.loads(answer)["sessionId"]
    with psycopg.connect(db_url) as conn:
        queued = conn.execute(
            "SELECT count(*) FROM dispatch_queue q JOIN dispatch_sessions s ON s.id = q.session_id "
            "WHERE s.id = %s AND s.status = 'queued'",
            (session,),
        ).fetchone()
        delivered = conn.execute("SELECT outcome FROM webhook_deliveries").fetchall()
    assert queued == (1,)
    assert delivered == [("dispatched",)]


def test_a_wrong_signature_is_refused_and_writes_nothing(floor: Floor, db_url: str) -> None:
    _, body = bodies("created", "t", 0, 1, 1.0)()
    status, _ = _post(floor, body, "not-the-secret")
    assert status == 401
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM webhook_deliveries").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM dispatch_queue").fetchone() == (0,)


def test_the_insert_floor_writes_one_row_a_webhook(db_url: str) -> None:
    f = Floor(db_url, SECRET, mode="insert")
    try:
        for _ in range(3):
            _, body = bodies("created", "t", 0, 1, 1.0)()
            status, answer = _post(f, body, SECRET)
            assert status == 200, answer
    finally:
        f.close()
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM floor_rows").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM webhook_deliveries").fetchone() == (0,)


def test_the_service_floor_dispatches_through_the_products_service(db_url: str) -> None:
    machine(db_url, USER_A)
    f = Floor(db_url, SECRET, mode="service")
    try:
        _, body = bodies("created", "t", 0, 1, 1.0)()
        status, answer = _post(f, body, SECRET)
        check("created", status, answer)
        assert _post(f, body, "not-the-secret")[0] == 401
    finally:
        f.close()
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT outcome FROM webhook_deliveries").fetchall() == [("dispatched",)]
