"""Property test: random interleavings of enqueue (plain assignments, and start/prompt messages of a
few agent sessions), claim, ack, release, sweep, Linear's stop and clock steps, against a simple
in-memory model of the contract. After every step the database's invariant holds, no message is
lost, no row is held by two live claims, one agent session's messages are claimable only in order,
and every answer is the model's."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg.types.json import Jsonb

from shared.delivery.models import DispatchPayload
from shared.delivery.queue import ack, claim, enqueue_dispatch, release, sweep
from shared.plumbing.db import Pool, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.wire.messages import MessageKind
from tests.helpers.data import MakeOrch, Orch, enqueue_one, issue
from tests.test_reliability import assert_invariant

LEASE = 60
BASE, CAP, MAX_ATTEMPTS = 10, 40, 3
POLICY = Settings(
    DEVPILOT_MAX_ATTEMPTS=MAX_ATTEMPTS, DEVPILOT_BACKOFF_BASE_SECONDS=BASE, DEVPILOT_BACKOFF_CAP_SECONDS=CAP
)
AGENTS = ("as-a", "as-b", "as-c")


def contract_backoff(n: int) -> int:
    """The contract's words, not the code's: after the n-th failed delivery, min(n² × base, cap)."""
    return min(n * n * BASE, CAP)


@dataclass
class Row:
    queue_id: UUID
    session_id: UUID
    available_at: datetime
    attempts: int = 0
    lease_until: datetime | None = None
    token: UUID | None = None
    tokens: list[UUID] = field(default_factory=list)
    status: str = "queued"  # queued | delivered | failed | cancelled
    acked_token: UUID | None = None
    agent: str | None = None
    kind: str = "start"


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, pool: Pool, orch: Orch) -> None:
        super().__init__()
        self.pool, self.orch = pool, orch
        with pool.connection() as conn:
            conn.execute(
                "TRUNCATE linear_notices, dispatch_queue, dispatch_attempts, dead_letters, session_actions,"
                " dispatch_sessions, webhook_deliveries, sweep_runs"
            )
        self.now = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
        self.rows: list[Row] = []
        self.n = 0

    def _live(self) -> list[Row]:
        return [r for r in self.rows if r.status == "queued"]

    @rule()
    def enqueue(self) -> None:
        self.n += 1
        # enqueue uses the database clock, which is before our model clock: due at once
        sid, enq = enqueue_one(self.pool, self.orch, self.n)
        with self.pool.connection() as conn:
            conn.execute(
                "UPDATE dispatch_queue SET available_at = %s WHERE id = %s", (self.now, enq.queue_id)
            )
        self.rows.append(Row(enq.queue_id, sid, self.now))

    @rule(agent=st.sampled_from(AGENTS), kind=st.sampled_from(("start", "prompt")))
    def enqueue_in_agent_session(self, agent: str, kind: MessageKind) -> None:
        self.rows.append(self._enqueue_agent(agent, kind))

    def _enqueue_agent(self, agent: str, kind: MessageKind) -> Row:
        self.n += 1
        iss = issue(self.n, self.orch.org_id)
        with transaction(self.pool) as tx:
            enq = enqueue_dispatch(
                tx,
                org_id=self.orch.org_id,
                orchestrator_id=self.orch.id,
                linear_user_id=self.orch.linear_user_id,
                message=DispatchPayload(issue=iss, agent_session_id=agent, kind=kind),
            )
            tx.execute(
                "UPDATE dispatch_queue SET available_at = %(at)s WHERE id = %(id)s",
                {"at": self.now, "id": enq.queue_id},
            )
        return Row(enq.queue_id, enq.session_id, self.now, agent=agent, kind=kind)

    @rule(agent=st.sampled_from(AGENTS))
    def stop(self, agent: str) -> None:
        """Linear's stop: every undelivered message of the agent session cancelled and, if one was
        delivered, a `stop` queued for the machine, in one transaction."""
        with transaction(self.pool) as tx:
            got = tx.all(
                query("cancel_agent_session"),
                {
                    "batch": Jsonb([{"org_id": self.orch.org_id, "agent_session_id": agent}]),
                    "reason": "stopped",
                },
            )
        cancelled = [r for r in self._live() if r.agent == agent]
        assert sorted(g["id"] for g in got) == sorted(r.session_id for r in cancelled)
        for r in cancelled:
            r.status = "cancelled"
        if any(r.agent == agent and r.status == "delivered" for r in self.rows):
            self.rows.append(self._enqueue_agent(agent, "stop"))

    def _first_of_its_session(self, r: Row) -> bool:
        """In order per agent session: nothing earlier of its session is still undelivered."""
        if r.agent is None:
            return True
        earlier = self.rows[: self.rows.index(r)]
        return not any(e.agent == r.agent and e.status == "queued" for e in earlier)

    @rule(max_=st.integers(1, 4))
    def claim_some(self, max_: int) -> None:
        due = sorted(
            (
                r
                for r in self._live()
                if r.lease_until is None and r.available_at <= self.now and self._first_of_its_session(r)
            ),
            key=lambda r: (r.available_at, str(r.queue_id)),
        )
        got = claim(self.pool, self.orch.id, max=max_, lease_seconds=LEASE, now=self.now)
        assert [m.queue_id for m in got] == [r.queue_id for r in due[:max_]]
        for m, r in zip(got, due, strict=False):
            r.attempts += 1
            assert m.attempt == r.attempts
            r.token = m.claim_token
            r.tokens.append(m.claim_token)
            r.lease_until = self.now + timedelta(seconds=LEASE)

    def _pick(self, i: int) -> Row | None:
        return self.rows[i % len(self.rows)] if self.rows else None

    def _token(self, r: Row, which: int) -> UUID:
        if which == 0 or not r.tokens:
            return uuid4()  # never issued
        return r.tokens[-1] if which == 1 else r.tokens[0]

    @rule(i=st.integers(0, 50), which=st.integers(0, 2))
    def ack_one(self, i: int, which: int) -> None:
        r = self._pick(i)
        if r is None:
            return
        tok = self._token(r, which)
        got = ack(self.pool, self.orch.id, r.queue_id, tok)
        if r.status == "delivered":
            expect = "acked" if tok == r.acked_token else "claim_superseded"
        elif r.status == "queued":
            expect = "acked" if tok == r.token else "claim_superseded"
        else:
            expect = "not_found"
        assert got == expect, (got, expect, r)
        if expect == "acked" and r.status == "queued":
            r.status, r.acked_token = "delivered", tok

    @rule(i=st.integers(0, 50), which=st.integers(0, 2))
    def release_one(self, i: int, which: int) -> None:
        r = self._pick(i)
        if r is None:
            return
        tok = self._token(r, which)
        got = release(self.pool, POLICY, self.orch.id, r.queue_id, tok, now=self.now)
        if r.status == "queued" and tok == r.token and r.lease_until is not None:
            assert got.status == "released"
            self._fail_attempt(r)
            assert got.dead_lettered == (r.status == "failed")
        elif r.status == "queued" and tok == r.token:
            assert got.status == "released" and not got.dead_lettered
        elif r.status in ("queued", "delivered"):
            assert got.status == "claim_superseded"
        else:
            assert got.status == "not_found"

    def _fail_attempt(self, r: Row) -> None:
        r.lease_until = None
        if r.attempts >= MAX_ATTEMPTS:
            r.status = "failed"
        else:
            r.available_at = self.now + timedelta(seconds=contract_backoff(r.attempts))

    @rule()
    def sweep_now(self) -> None:
        expired = [r for r in self._live() if r.lease_until is not None and r.lease_until <= self.now]
        for r in expired:
            self._fail_attempt(r)
        got = sweep(self.pool, POLICY, now=self.now)
        assert got.requeued + got.dead_lettered == len(expired)
        assert got.dead_lettered == sum(1 for r in expired if r.status == "failed")

    @rule(seconds=st.sampled_from([1, 10, 30, 61, 120, 600]))
    def tick(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)

    @invariant()
    def matches_the_database(self) -> None:
        assert_invariant(self.pool)
        with self.pool.connection() as conn:
            sessions = {
                r["id"]: r["status"] for r in conn.execute("SELECT id, status FROM dispatch_sessions")
            }
            queue = {
                r["id"]: r
                for r in conn.execute(
                    "SELECT id, attempts, claim_token, lease_expires_at, available_at FROM dispatch_queue"
                )
            }
        assert len(sessions) == len(self.rows)  # nothing lost
        for r in self.rows:
            assert sessions[r.session_id] == r.status
            if r.status == "queued":
                q = queue[r.queue_id]
                assert (q["attempts"], q["claim_token"], q["lease_expires_at"], q["available_at"]) == (
                    r.attempts,
                    r.token,
                    r.lease_until,
                    r.available_at,
                )
            else:
                assert r.queue_id not in queue


def test_queue_state_machine(pool: Pool, make_orchestrator: MakeOrch) -> None:
    orch = make_orchestrator()
    run_state_machine_as_test(
        lambda: QueueMachine(pool, orch),  # type: ignore[arg-type]  # a factory is documented and works
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
