"""The reference orchestrator as a real process against the real service over real HTTP."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from pytest_httpserver import HTTPServer

from tests.helpers.api import Api, issue_event

ROOT = Path(__file__).parent.parent


class Orch:
    def __init__(
        self,
        api_url: str,
        token: str,
        tmp: Path,
        transport: str = "poll",
        interval: float = 0.3,
        extra: list[str] | None = None,
        token_in_env: bool = False,
        command: list[str] | None = None,
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
    ) -> None:
        self.token = token  # the machine's, for the tests' own calls as it
        self.token_env = {"DEVPILOT_ORCHESTRATOR_TOKEN": token} if token_in_env else {}
        self.cwd, self.env = cwd, env or {}
        self.started_file = tmp / "started.jsonl"
        self.state = tmp / "state"
        self.log_file = tmp / "orchestrator.log"
        self.args = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "--url",
            api_url,
            *([] if token_in_env else ["--token", token]),
            "--transport",
            transport,
            "--poll-interval",
            str(interval),
            "--state-dir",
            str(self.state),
            *(extra or []),
            "--",
            *(command or [sys.executable, str(ROOT / "tests/helpers/record_start.py")]),
            str(self.started_file),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_mark = 0  # where this run's lines begin in the log

    def start(self) -> None:
        self._log_mark = len(self.log())
        log = open(self.log_file, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            self.args,
            cwd=self.cwd,
            stderr=log,
            stdout=log,
            env={**os.environ, "PYTHONPATH": str(ROOT), **self.token_env, **self.env},
        )

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> int:
        """SIGTERM, once the process says it is up (its handler installed: a SIGTERM before that
        ends it by the default action, -15, on a busy host)."""
        assert self.proc is not None
        deadline = time.monotonic() + 30
        while self.proc.poll() is None and "orchestrator up" not in self.log()[self._log_mark :]:
            assert time.monotonic() < deadline, "the orchestrator never said it was up"
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def starts(self) -> list[dict[str, Any]]:
        if not self.started_file.exists():
            return []
        return [json.loads(line) for line in self.started_file.read_text().splitlines() if line.strip()]

    def log(self) -> str:
        return self.log_file.read_text() if self.log_file.exists() else ""


def wait_for(cond: Any, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def delivered(api: Api) -> int:
    with api.pool.connection() as conn:
        r = conn.execute("SELECT count(*) AS n FROM dispatch_sessions WHERE status = 'delivered'").fetchone()
    assert r is not None
    return int(r["n"])


@pytest.fixture
def orch_factory(api: Api, tmp_path: Path) -> Iterator[Any]:
    made: list[Orch] = []

    def make(transport: str = "poll", interval: float = 0.3, extra: list[str] | None = None) -> Orch:
        _, token = api.register()
        o = Orch(api.url, token, tmp_path, transport, interval, extra)
        made.append(o)
        return o

    yield make
    for o in made:
        if o.proc is not None and o.proc.poll() is None:
            o.proc.kill()
            o.proc.wait()


@pytest.mark.parametrize("transport", ["poll", "listen"])
def test_transport_delivers_and_starts_once(api: Api, orch_factory: Any, transport: str) -> None:
    o = orch_factory(transport)
    o.start()
    sent = [api.webhook(issue_event(issue_id=f"t-{n}")).json() for n in range(5)]
    wait_for(lambda: len(o.starts()) == 5, what="5 starts")
    assert o.stop() == 0
    starts = o.starts()
    assert sorted(s["messageId"] for s in starts) == sorted(a["messageId"] for a in sent)
    env = starts[0]["env"]
    assert set(env) >= {
        "DEVPILOT_MESSAGE_ID",
        "DEVPILOT_SESSION_ID",
        "DEVPILOT_QUEUE_ID",
        "DEVPILOT_ISSUE_ID",
        "DEVPILOT_ISSUE_IDENTIFIER",
        "DEVPILOT_ISSUE_URL",
    }
    assert env["DEVPILOT_ISSUE_IDENTIFIER"] == "ENG-42"
    assert delivered(api) == 5
    log = o.log()
    assert "claimed ENG-42 (attempt 1)" in log and "acked ENG-42" in log and "started ENG-42" in log


def test_a_plain_assignment_carries_its_request_on_stdin_as_in_devpilot_prompt(
    api: Api, orch_factory: Any
) -> None:
    """An agent that reads its message on stdin (as the README says it may) gets the request of a
    plain assignment too: `prompt.context`, the same text as DEVPILOT_PROMPT."""
    o = orch_factory()
    o.start()
    api.webhook(issue_event(issue_id="plain-1"))
    wait_for(lambda: len(o.starts()) == 1, what="the start")
    assert o.stop() == 0
    [start] = o.starts()
    request = "ENG-42: Fix the flaky test\n\nIt fails on Tuesdays."
    assert start["prompt"]["context"] == request == start["env"]["DEVPILOT_PROMPT"]
    # as every machine claims it
    _, token = api.register(user="user-2")
    api.webhook(issue_event(issue_id="plain-2", assignee="user-2"))
    [message] = api.post_as(token, "/claim", {}).json()["messages"]
    assert message["kind"] == "start" and message["prompt"]["context"] == request


def test_work_queued_while_offline_is_taken_on_start(api: Api, orch_factory: Any) -> None:
    o = orch_factory("poll", interval=30)  # only the start-up sweep can find it in time
    for n in range(3):
        api.webhook(issue_event(issue_id=f"off-{n}"))
    o.start()
    wait_for(lambda: len(o.starts()) == 3, timeout=20, what="reconnect sweep")
    assert o.stop() == 0


# A 1 s lease and 1 s backoff, so a frozen or killed orchestrator's claims come back within seconds.
SHORT_LEASE = {
    "DEVPILOT_LEASE_SECONDS": 1,
    "DEVPILOT_BACKOFF_BASE_SECONDS": 1,
    "DEVPILOT_BACKOFF_CAP_SECONDS": 1,
    "DEVPILOT_MAX_ATTEMPTS": 50,
}


def _stress(api: Api, o: Orch, disrupt: Any, n: int = 24) -> None:
    """Send n webhooks over time while `disrupt(o)` freezes or kills the orchestrator; sweep often."""
    stop = threading.Event()

    def sweeper() -> None:
        while not stop.is_set():
            api.http.post("/sweep", headers=api.admin())
            time.sleep(0.3)

    sw = threading.Thread(target=sweeper, daemon=True)
    sw.start()
    o.start()
    rng = random.Random(7)
    try:
        for i in range(n):
            api.webhook(issue_event(issue_id=f"s-{i}"))
            if i % 6 == 5:
                disrupt(o, rng)
            time.sleep(rng.uniform(0.02, 0.15))
        wait_for(lambda: delivered(api) == n, timeout=90, what=f"{n} deliveries")
        wait_for(lambda: len(o.starts()) >= n, timeout=30, what="starts")
        time.sleep(1.0)
    finally:
        stop.set()
        sw.join()
    ids = [s["messageId"] for s in o.starts()]
    assert len(ids) == n and len(set(ids)) == n, "a message was started twice or not at all"


@pytest.mark.parametrize("api_overrides", [SHORT_LEASE])
def test_frozen_past_the_lease_starts_each_message_once(api: Api, orch_factory: Any) -> None:
    def freeze(o: Orch, rng: random.Random) -> None:
        o.signal(signal.SIGSTOP)
        time.sleep(rng.uniform(1.2, 2.0))  # past the 1 s lease: the sweep re-queues what it held
        o.signal(signal.SIGCONT)

    o = orch_factory("poll", interval=0.2)
    _stress(api, o, freeze)
    assert o.stop() == 0


@pytest.mark.parametrize("api_overrides", [SHORT_LEASE])
def test_sigkilled_and_restarted_starts_each_message_once(api: Api, orch_factory: Any) -> None:
    def kill(o: Orch, rng: random.Random) -> None:
        time.sleep(rng.uniform(0.0, 0.3))
        o.signal(signal.SIGKILL)
        assert o.proc is not None
        o.proc.wait()
        o.start()  # same state dir

    o = orch_factory("listen")
    _stress(api, o, kill)
    assert o.stop() == 0


def test_service_down_and_back(api: Api, orch_factory: Any) -> None:
    from werkzeug.serving import make_server

    from devpilot.serve import QuietHandler
    from functions.app import wsgi

    o = orch_factory("poll", interval=0.2)
    o.start()
    api.webhook(issue_event(issue_id="before"))
    wait_for(lambda: len(o.starts()) == 1, what="first start")
    assert api.served is not None
    port = api.served.server.port
    api.served.server.shutdown()  # the service goes away ...
    api.served.server.server_close()
    wait_for(lambda: "unreachable" in o.log(), what="away log line")
    time.sleep(2.0)
    again = make_server("127.0.0.1", port, wsgi, threaded=True, request_handler=QuietHandler)
    t = threading.Thread(target=again.serve_forever, daemon=True)  # ... and comes back on its port
    t.start()
    try:
        api.webhook(issue_event(issue_id="after"))
        wait_for(lambda: len(o.starts()) == 2, timeout=40, what="start after the service came back")
        assert o.stop() == 0
        log = o.log()
        assert log.count("service unreachable") == 1 and log.count("reachable again") == 1
    finally:
        again.shutdown()
        api.served.server = again  # the fixture's close() is then a no-op shutdown of a stopped server


def test_sigterm_exits_zero_and_starts_nothing_new(api: Api, orch_factory: Any) -> None:
    o = orch_factory("listen")
    o.start()
    api.webhook(issue_event(issue_id="one"))
    wait_for(lambda: len(o.starts()) == 1, what="start")
    assert o.stop() == 0
    assert "stopped" in o.log()
    api.webhook(issue_event(issue_id="two"))
    time.sleep(0.5)
    assert len(o.starts()) == 1


@pytest.mark.parametrize("transport", ["poll", "listen"])
def test_a_child_exit_while_the_service_is_away_does_not_make_it_spin(
    transport: str, tmp_path: Path, httpserver: HTTPServer
) -> None:
    """The service answers 503 to everything: the orchestrator backs off (0.5 s, doubling). One
    SIGCHLD (a COMMAND exited) wakes it once; it must not leave every later wait, the backoff
    included, returning at once (a wake-up never forgotten had it retry hundreds of thousands of
    times a second)."""
    httpserver.expect_request("/claim").respond_with_data("down", status=503)
    httpserver.expect_request("/machine").respond_with_data("down", status=503)
    o = Orch(httpserver.url_for("").rstrip("/"), "dpo_unused", tmp_path, transport, 0.3)
    o.start()
    try:
        wait_for(lambda: "service unreachable" in o.log(), what="the service to be away")
        assert o.proc is not None
        o.signal(signal.SIGCHLD)
        time.sleep(3)
        claims = sum(1 for req, _ in httpserver.log if req.path == "/claim")
        assert claims < 30, claims  # (about five: 0.5 + 1 + 2 s of backoff, and the one woken)
    finally:
        assert o.stop() == 0


def test_sigterm_after_a_storm_of_child_exits_still_stops_it(api: Api, orch_factory: Any) -> None:
    """SIGCHLD (a COMMAND exited) wakes the loop from a signal handler, which Python runs between two
    bytecodes of the main thread, also while that thread is inside the wake-up's own code. Thousands
    of them, then SIGTERM: the orchestrator still claims, still stops, and exits 0 (a wake-up with a
    lock hung it here, handler waiting on its own thread, and then ignored SIGTERM)."""
    o = orch_factory("poll", interval=0.05)
    o.start()
    api.webhook(issue_event(issue_id="before-the-storm"))
    wait_for(lambda: len(o.starts()) == 1, what="start")
    assert o.proc is not None
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and o.proc.poll() is None:
        for _ in range(200):
            os.kill(o.proc.pid, signal.SIGCHLD)
        time.sleep(0.001)
    api.webhook(issue_event(issue_id="after-the-storm"))
    wait_for(lambda: len(o.starts()) == 2, timeout=10, what="a claim after the storm")
    assert o.stop() == 0


@pytest.mark.parametrize(
    "api_overrides",
    [{"SUPABASE_URL": "http://127.0.0.1:9", "SUPABASE_ANON_KEY": "anon", "SUPABASE_JWT_SECRET": "x" * 40}],
)
def test_realtime_falls_back_to_polling_when_the_socket_cannot_be_had(api: Api, orch_factory: Any) -> None:
    o = orch_factory("realtime", interval=0.3)
    o.start()
    api.webhook(issue_event(issue_id="rt-fallback"))
    wait_for(lambda: len(o.starts()) == 1, what="start via polling")
    wait_for(lambda: "realtime unavailable" in o.log(), what="the fallback said once")
    time.sleep(3)  # more reconnect attempts fail meanwhile; it is still said only once
    api.webhook(issue_event(issue_id="rt-fallback-2"))
    wait_for(lambda: len(o.starts()) == 2, what="second start via polling")
    assert o.stop() == 0
    assert o.log().count("realtime unavailable") == 1


def test_realtime_disabled_route_means_polling(api: Api, orch_factory: Any) -> None:
    o = orch_factory("realtime", interval=0.3)
    o.start()
    api.webhook(issue_event(issue_id="rt-disabled"))
    wait_for(lambda: len(o.starts()) == 1, what="start via polling")
    assert o.stop() == 0
    assert "realtime_disabled" in o.log()


@dataclass
class RealtimeRig:
    standin: Any  # tests.helpers.phoenix_standin.PhoenixStandIn
    api: Api
    orchestrator_id: str
    orch: Orch


REALTIME_SECRET = "k" * 40


@contextmanager
def realtime_orchestrator(db_url: str, tmp_path: Path, **settings: object) -> Iterator[RealtimeRig]:
    """The service with Realtime pointed at a local Phoenix-channel stand-in, and a realtime
    orchestrator whose poll interval (120 s) cannot explain a pickup, subscribed before it is yielded."""
    import httpx

    from shared.plumbing.db import open_pool
    from tests.helpers.api import Served
    from tests.helpers.data import api_settings
    from tests.helpers.phoenix_standin import PhoenixStandIn

    standin = PhoenixStandIn()
    config = api_settings(
        SUPABASE_URL=standin.url,
        SUPABASE_ANON_KEY="anon-key",
        SUPABASE_JWT_SECRET=REALTIME_SECRET,
        **settings,
    )
    pool = open_pool(db_url, config, max_size=10)
    served = Served(db_url, config, pool)
    try:
        with httpx.Client(base_url=served.url, timeout=30) as http:
            api = Api(served.url, config, pool, http)
            oid, token = api.register()
            o = Orch(api.url, token, tmp_path, "realtime", interval=120)
            o.start()
            wait_for(lambda: "realtime connected" in o.log(), what="realtime subscription")
            yield RealtimeRig(standin, api, oid, o)
    finally:
        served.close()
        pool.close()
        standin.close()


def test_realtime_joins_with_the_token_and_claims_on_an_event(db_url: str, tmp_path: Path) -> None:
    """Against a local Phoenix-channel server standing in for Supabase Realtime."""
    import jwt

    with realtime_orchestrator(db_url, tmp_path) as rig:
        standin, api, oid, o = rig.standin, rig.api, rig.orchestrator_id, rig.orch
        [join] = standin.joins
        assert join["topic"] == f"realtime:devpilot:orchestrator_id=eq.{oid}"
        assert "apikey=anon-key" in join["path"]
        [change] = join["payload"]["config"]["postgres_changes"]
        assert change == {
            "event": "INSERT",
            "schema": "public",
            "table": "dispatch_queue",
            "filter": f"orchestrator_id=eq.{oid}",
        }
        claims = jwt.decode(
            join["payload"]["access_token"], REALTIME_SECRET, algorithms=["HS256"], audience="authenticated"
        )
        assert claims["orchestrator_id"] == oid
        time.sleep(0.5)
        api.webhook(issue_event(issue_id="rt-1"))
        time.sleep(1.0)
        assert o.starts() == []  # nothing woke it yet: no event, long poll interval
        assert standin.push_insert({"orchestrator_id": oid}) == 1
        wait_for(lambda: len(o.starts()) == 1, timeout=10, what="start on the realtime event")
        assert o.stop() == 0


@pytest.mark.parametrize("marker", [True, False])
def test_resume_of_an_interrupted_start_uses_the_marker(api: Api, orch_factory: Any, marker: bool) -> None:
    """A crash between 'starting' and the fork: on the next run the start happens exactly when the
    launcher's marker says it did not happen yet."""
    from orchestrator.conversations import Conversations, conversation_key
    from orchestrator.journal import Journal

    o = orch_factory("poll", interval=30)
    api.webhook(issue_event(issue_id="interrupted"))
    [m] = api.post_as(o.token, "/claim").json()["messages"]
    api.post_as(o.token, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    j = Journal(o.state / "journal.sqlite3")
    j.record(m)
    conversations = Conversations(o.state)
    conversations.put(conversations.of(conversation_key(m)), m)  # (what the interrupted run did)
    j.mark(m["messageId"], "starting")
    j.close()
    if marker:
        (o.state / "started").mkdir(parents=True, exist_ok=True)
        (o.state / "started" / m["messageId"]).touch()
    o.start()
    if marker:
        wait_for(lambda: "already started before the last stop" in o.log(), what="the marker honoured")
        time.sleep(0.5)
        assert o.starts() == []
    else:
        wait_for(lambda: len(o.starts()) == 1, what="the interrupted start resumed")
        assert o.starts()[0]["messageId"] == m["messageId"]
        assert (o.state / "started" / m["messageId"]).exists()
    assert o.stop() == 0


def test_token_from_the_environment_never_reaches_command_and_state_is_private(
    api: Api, tmp_path: Path
) -> None:
    """The token is read from DEVPILOT_ORCHESTRATOR_TOKEN (not on the command line, which the
    process list shows); COMMAND's environment holds neither the variable nor its value; the state
    folder is the user's alone (0700) and every file in it 0600."""
    _, token = api.register()
    o = Orch(api.url, token, tmp_path, token_in_env=True)
    o.start()
    assert o.proc is not None
    assert token not in " ".join(o.args)
    api.webhook(issue_event(issue_id="secret-env"))
    wait_for(lambda: len(o.starts()) == 1, what="one start")
    assert o.stop() == 0
    [start] = o.starts()
    assert "DEVPILOT_ORCHESTRATOR_TOKEN" not in start["env"] and token not in json.dumps(start)
    assert (o.state.stat().st_mode & 0o777) == 0o700
    files = [p for p in o.state.rglob("*")]
    assert any(p.name == "journal.sqlite3" for p in files) and any(p.suffix == ".jsonl" for p in files)
    for p in files:
        assert (p.stat().st_mode & 0o777) == (0o700 if p.is_dir() else 0o600), p


def test_a_message_id_that_is_not_a_uuid_is_never_written_nor_started(
    httpserver: Any, tmp_path: Path
) -> None:
    """A service (or whoever answers in its place) handing out `../../x`, an absolute path or a NUL
    byte as messageId: logged, nothing written outside (or inside) the state folder, never started,
    and the orchestrator goes on to the next message — and starts cleanly again afterwards."""
    from uuid import uuid4

    from werkzeug import Response

    def message(mid: str) -> dict[str, Any]:
        return {
            "messageId": mid,
            "queueId": str(uuid4()),
            "sessionId": str(uuid4()),
            "orgId": "org-a",
            "orchestratorId": str(uuid4()),
            "attempt": 1,
            "claimToken": str(uuid4()),
            "leaseExpiresAt": "2026-12-03T10:00:00+00:00",
            "createdAt": "2026-12-03T10:00:00+00:00",
            "issue": {"id": "i", "identifier": "ENG-9", "title": "t", "url": None, "description": None},
            "agentSessionId": None,
        }

    good = str(uuid4())
    batches = [
        [message("../../escaped"), message(str(tmp_path / "absolute")), message("nul\x00byte"), message(good)]
    ]
    acked: list[str] = []

    def claim(request: Any) -> Response:
        return Response(
            json.dumps({"messages": batches.pop() if batches else []}), content_type="application/json"
        )

    def ack(request: Any) -> Response:
        acked.append(json.loads(request.data)["queueId"])
        return Response(json.dumps({"status": "acked"}), content_type="application/json")

    httpserver.expect_request("/claim", method="POST").respond_with_handler(claim)
    httpserver.expect_request("/ack", method="POST").respond_with_handler(ack)
    o = Orch(httpserver.url_for("").rstrip("/"), "dpo_test", tmp_path)
    o.start()
    wait_for(lambda: len(o.starts()) == 1, what="the good message started")
    time.sleep(0.5)
    assert o.proc is not None and o.proc.poll() is None  # still running
    assert [s["messageId"] for s in o.starts()] == [good] and len(acked) == 1
    assert o.log().count("refused a message whose messageId is not a UUID") == 3
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "escaped.json").exists()
    assert not (tmp_path / "absolute").exists() and not (tmp_path / "absolute.json").exists()
    assert {p.name for p in (o.state / "inboxed").iterdir()} == {good}
    assert o.stop() == 0
    o.start()  # nothing bad was journaled: a restart neither crashes nor starts anything again
    time.sleep(1.0)
    assert o.proc.poll() is None and len(o.starts()) == 1
    assert o.stop() == 0


def test_sigterm_finishes_the_ack_in_flight_and_the_next_run_starts_it(
    api: Api, orch_factory: Any, db_url: str
) -> None:
    """SIGTERM while an ack is in flight: the ack completes (the session is delivered, not left to
    the sweep), nothing new starts, the process exits 0; the next run finds the acked, unstarted
    message in its journal and starts it, once. The ack is held in flight by a row lock on the
    session, so the SIGTERM is known to land during it."""
    import psycopg

    o = orch_factory("poll", interval=0.3)  # (registers the machine)
    sent = api.webhook(issue_event(issue_id="sigterm-ack")).json()
    holder = psycopg.connect(db_url)  # a transaction that holds the session row
    try:
        holder.execute(
            "SELECT 1 FROM dispatch_sessions WHERE message_id = %s FOR UPDATE", (sent["messageId"],)
        )
        o.start()
        with psycopg.connect(db_url, autocommit=True) as watch:

            def ack_waits() -> bool:
                row = watch.execute(
                    # (by its wait alone: the statement's text as Postgres shows it is cut at
                    # track_activity_query_size, before the ack's tables are named)
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ).fetchone()
                return row is not None and row[0] > 0

            wait_for(ack_waits, timeout=20, what="the ack waiting on the session row")
        o.signal(signal.SIGTERM)
        time.sleep(1.0)
        assert o.proc is not None and o.proc.poll() is None  # still finishing its ack
        holder.rollback()  # the ack goes through now
        assert o.proc.wait(timeout=20) == 0
    finally:
        holder.close()
    assert delivered(api) == 1  # acked before it exited
    assert "acked ENG-42" in o.log()
    assert o.starts() == []  # SIGTERM: nothing new started
    o.start()
    wait_for(lambda: len(o.starts()) == 1, what="the acked message started by the next run")
    assert o.log().count("started ENG-42") == 1  # by the next run, from the inbox it was acked into
    time.sleep(1.0)
    assert o.stop() == 0
    assert [s["messageId"] for s in o.starts()] == [sent["messageId"]]


def test_realtime_renews_its_token_before_it_expires_and_not_on_every_tick(
    db_url: str, tmp_path: Path
) -> None:
    """With 30 s tokens the orchestrator hands the socket a new token with a quarter of the old
    one's life left (about 22 s in), once — not at every half-second tick — and keeps claiming."""
    import jwt

    def decoded(token: str) -> dict[str, Any]:
        claims: dict[str, Any] = jwt.decode(
            token, REALTIME_SECRET, algorithms=["HS256"], audience="authenticated"
        )
        return claims

    with realtime_orchestrator(db_url, tmp_path, DEVPILOT_REALTIME_TOKEN_SECONDS=30) as rig:
        standin, o = rig.standin, rig.orch
        joined_at = time.monotonic()
        [join] = standin.joins
        first = decoded(join["payload"]["access_token"])
        wait_for(lambda: len(standin.access_tokens) >= 1, timeout=40, what="a renewed token")
        renewed_after = time.monotonic() - joined_at
        assert 15 < renewed_after < 28, renewed_after  # a quarter of 30 s before expiry, not at once
        time.sleep(3)
        assert len(set(standin.access_tokens)) == 1  # renewed once, not on every tick
        fresh = decoded(standin.access_tokens[0])
        assert fresh["exp"] > first["exp"] and fresh["orchestrator_id"] == first["orchestrator_id"]
        rig.api.webhook(issue_event(issue_id="rt-renewed"))
        assert standin.push_insert({"orchestrator_id": rig.orchestrator_id}) == 1
        wait_for(lambda: len(o.starts()) == 1, timeout=10, what="a claim after the renewal")
        assert o.stop() == 0


def test_idle_polls_are_jittered_around_the_interval(
    api: Api, orch_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An idle fleet must not poll in lockstep: each wait is the interval times a random factor in
    [0.8, 1.2] (seen from the server: the times between one machine's /claim calls)."""
    import logging

    from functions.logs import Fields

    caplog.set_level(logging.DEBUG, logger="devpilot.request")  # (an empty poll is a debug line)
    o = orch_factory("poll", interval=0.3)

    def claims() -> list[tuple[float, float]]:
        # Each claim as the server saw it: (arrived, answered). The machine's wait is the time from
        # one answer to the next arrival; a slow answer (a database stall) is the server's time.
        return [
            (r.created - cast(float, r.args["ms"]) / 1000, r.created)
            for r in list(caplog.records)
            if isinstance(r.args, Fields) and r.args.get("route") == "claim" and r.args.get("status") == 200
        ]

    o.start()
    # Counted, not timed: on a loaded host the machine's start-up alone can take seconds.
    wait_for(lambda: len(claims()) >= 18, 60, "eighteen polls")
    assert o.stop() == 0
    spans = claims()
    # (the first wait follows start-up)
    gaps = [arrived - answered for (_, answered), (arrived, _) in itertools.pairwise(spans[1:])]
    assert len(gaps) >= 15, gaps
    assert min(gaps) > 0.8 * 0.3 - 0.03 and max(gaps) < 1.2 * 0.3 + 0.15, gaps
    assert max(gaps) - min(gaps) > 0.06, gaps  # not a fixed period
