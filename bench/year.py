"""A year in production, in a database: what `bench.statements --sessions N` times at 10 million
kept sessions, and what the plan tests (tests/test_plans_at_scale.py) read the plans of at 100,000.

`seed` writes N sessions set-based, as a deployment with DEVPILOT_RETENTION_DAYS=90 holds them: 99 %
changed over the last 90 days (about N/90 a day), 1 % older than the retention (what the next
sweeps forget); 2 % failed, 2 % cancelled, the rest delivered; 70 % in agent sessions of up to
three messages; one post to Linear each, sent; a claim record for 1 %, an operator's action for
0.1 %, a dead letter for each failure, a routing request for 5 %; a week of webhook deliveries;
and the live work: 10,000 queued messages on 100 machines, 1 % of them with expired leases.

`workload` then does what the service does, once or a few times each, through the library: the
webhooks of each kind, a machine's poll, claim, acks, release, activity, plan and transcript, the
sweep (re-queue, routing, posts to Linear, delivery records, retention), the operators' snapshot
(dashboard, `devpilot status`) and a metrics scrape, a session's page, each search, each
operator's action, and the revoke of a machine with its queued work.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple
from uuid import UUID

from bench.loadgen import agent_created, assignment, edit, prompted, reassigned, stopped
from shared.delivery import queue
from shared.delivery.queue import AckItem
from shared.dispatch import Dispatch
from shared.fleet.orchestrators import Orchestrator, hash_token, register
from shared.linear import auth as linear_auth
from shared.linear import webhooks as linear
from shared.operators import sessions, status
from shared.plumbing.db import Pool, transaction
from shared.plumbing.settings import Settings

ORG = "bench"
MACHINES = 100
QUEUED = 10_000
CHUNK = 500_000  # sessions per statement of the seed


class Machine(NamedTuple):
    id: UUID
    token_hash: bytes


class Year(NamedTuple):
    machines: list[Machine]  # m0 .. m99, user u0 .. u99 each
    sessions: int


def found(pool: Pool) -> Year | None:
    """The year a database was seeded with, to run the workload on it again."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT id, token_hash FROM orchestrators WHERE org_id = %s AND name ~ '^m[0-9]+$'"
            " AND revoked_at IS NULL ORDER BY substr(name, 2)::int",
            (ORG,),
        ).fetchall()
        n = conn.execute("SELECT count(*) AS n FROM dispatch_sessions").fetchone()
    if len(rows) < 60 or n is None:  # (each workload revokes one)
        return None
    return Year([Machine(r["id"], bytes(r["token_hash"])) for r in rows], int(n["n"]))


SEED_SESSIONS = """
WITH s AS (
    INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, kind, linear_user_id, issue_id,
                                   issue_identifier, agent_session_id, queue_id, message_id, created_at,
                                   updated_at, delivered_at, claimed_at)
    SELECT 'bench', (%(machines)s::uuid[])[1 + g %% 100],
           CASE g %% 50 WHEN 0 THEN 'failed' WHEN 1 THEN 'cancelled' ELSE 'delivered' END,
           CASE WHEN g %% 10 < 7 AND g %% 3 <> 0 THEN 'prompt' ELSE 'start' END,
           'u' || (g %% 100), 'issue-' || (g %% 100000), 'ENG-' || (g %% 100000),
           CASE WHEN g %% 10 < 7 THEN 'as-' || (g / 3) END, gen_random_uuid(), gen_random_uuid(),
           t.at, t.at + interval '1 minute',
           CASE WHEN g %% 50 > 1 THEN t.at + interval '1 minute' END,
           CASE WHEN g %% 50 > 1 THEN t.at + interval '30 seconds' END
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) g
    CROSS JOIN LATERAL (
        SELECT now() - CASE WHEN g <= %(n)s / 100
                            THEN interval '91 days' + (%(n)s / 100 - g) * interval '29 days' / (%(n)s / 100)
                            ELSE (%(n)s - g) * interval '90 days' / %(n)s END AS at
    ) t
    RETURNING id, org_id, agent_session_id, status, kind, created_at, updated_at
), posts AS (
    INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, issue_id, body, content,
                                created_at, available_at, sent_at, attempts, linear_id)
    SELECT s.org_id, s.id, 'delivered', s.agent_session_id, 'issue', 'Picked up by m',
           '{"type": "thought", "body": "Picked up by m"}', s.created_at, s.created_at,
           s.created_at + interval '2 seconds', 1, 'act'
    FROM s
), claims AS (
    INSERT INTO dispatch_attempts (session_id, attempt, claimed_at, ended_at, error)
    SELECT s.id, 1, s.created_at, s.created_at + interval '1 minute', 'lease expired'
    FROM s WHERE hashtext(s.id::text) %% %(claims_every)s = 0
), letters AS (
    INSERT INTO dead_letters (session_id, payload, attempts, reason, failed_at)
    SELECT s.id, '{"issue": {"id": "issue", "identifier": "ENG-1"}}', 5, 'no ack', s.updated_at
    FROM s WHERE s.status = 'failed' OR (%(dense)s AND hashtext(s.id::text) %% 5 = 3)
), actions AS (
    INSERT INTO session_actions (session_id, action, actor, detail, at)
    SELECT s.id, 'retry', 'operator', 'queued again on m', s.updated_at
    FROM s WHERE hashtext(s.id::text) %% %(actions_every)s = 1
)
INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message, attempts, created_at, done_at,
                              outcome, session_id)
SELECT s.org_id, s.agent_session_id, 'issue', 'assignee', '{}', 1, s.created_at, s.created_at, 'dispatched', s.id
FROM s
WHERE s.agent_session_id IS NOT NULL AND (s.kind = 'start' OR %(dense)s)
  AND hashtext(s.id::text) %% %(routes_every)s = 1
"""

SEED_STOPS = """
INSERT INTO agent_session_stops (org_id, agent_session_id, stopped_at, last_stop_at)
SELECT 'bench', 'stopped-' || g, now() - (g * interval '7 days') / %(n)s, now() - (g * interval '7 days') / %(n)s
FROM generate_series(1, %(n)s) g
"""

SEED_DELIVERIES = """
INSERT INTO webhook_deliveries (delivery_key, content_key, session_id, outcome, received_at, org_id, issue_id, event_at)
SELECT 'dk-' || g, 'ck-' || g, NULL, 'ignored', now() - (g * interval '7 days') / %(n)s, 'bench',
       'issue-' || (g %% 100000), CASE WHEN g %% 10 = 0 THEN now() - (g * interval '7 days') / %(n)s END
FROM generate_series(1, %(n)s) g
"""

SEED_QUEUE = """
WITH s AS (
    INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, kind, linear_user_id, issue_id,
                                   issue_identifier, queue_id, message_id, created_at, updated_at)
    SELECT 'bench', (%(machines)s::uuid[])[1 + g %% 100], 'queued', 'start', 'u' || (g %% 100),
           'live-' || g, 'LIVE-' || g, gen_random_uuid(), gen_random_uuid(),
           now() - interval '10 minutes', now() - interval '10 minutes'
    FROM generate_series(1, %(n)s) g
    RETURNING id, orchestrator_id, queue_id, message_id, issue_id, issue_identifier
)
INSERT INTO dispatch_queue (id, session_id, orchestrator_id, org_id, message_id, payload, available_at, attempts,
                            claim_token, claimed_at, lease_expires_at)
SELECT s.queue_id, s.id, s.orchestrator_id, 'bench', s.message_id,
       jsonb_build_object('issue', jsonb_build_object('id', s.issue_id, 'identifier', s.issue_identifier,
                                                      'title', 'bench')),
       now() - interval '10 minutes', CASE WHEN e THEN 1 ELSE 0 END,
       CASE WHEN e THEN gen_random_uuid() END, CASE WHEN e THEN now() - interval '2 hours' END,
       CASE WHEN e THEN now() - interval '1 hour' END
FROM s CROSS JOIN LATERAL (SELECT hashtext(s.id::text) %% 100 = 0 AS e) x
"""


def seed(pool: Pool, settings: Settings, n: int, *, dense: bool = False, log: bool = False) -> Year:
    """N kept sessions and everything around them (see the module's docstring). `dense`: the parts
    that are a small share of a year (claim records, operators' actions, dead letters, routing
    requests, delivery records, stops) are tens of thousands of rows at 100,000 sessions, so that
    a plan test reads each as a table that grows, not as a small one the planner rightly reads
    whole."""
    machines = [register(pool, org_id=ORG, linear_user_id=f"u{i}", name=f"m{i}") for i in range(MACHINES)]
    linear_auth.store_static(pool, settings, ORG, "lin_api_bench")
    ids = [m.id for m in machines]
    t0 = time.monotonic()
    for lo in range(1, n + 1, CHUNK):
        with transaction(pool) as tx:
            tx.execute("SET LOCAL statement_timeout = 0")
            hi = min(n, lo + CHUNK - 1)
            shares = (
                {"claims_every": 4, "actions_every": 4, "routes_every": 2}
                if dense
                else {"claims_every": 100, "actions_every": 1000, "routes_every": 20}
            )
            tx.execute(SEED_SESSIONS, {"machines": ids, "lo": lo, "hi": hi, "n": n, "dense": dense, **shares})
        if log:
            print(f"  seeded {hi:,} sessions ({time.monotonic() - t0:.0f} s)", flush=True)
    with transaction(pool) as tx:
        tx.execute("SET LOCAL statement_timeout = 0")
        tx.execute(SEED_DELIVERIES, {"n": max(1, n // 5 if dense else n * 7 // 90)})
        tx.execute(SEED_STOPS, {"n": max(1, n // 10 if dense else n // 1000)})
        tx.execute(SEED_QUEUE, {"machines": ids, "n": min(QUEUED, max(100, n // 10))})
    with pool.connection() as conn:
        conn.execute("SET statement_timeout = 0")
        for table in (
            "dispatch_sessions",
            "linear_notices",
            "dispatch_queue",
            "dispatch_attempts",
            "dead_letters",
            "session_actions",
            "routing_requests",
            "webhook_deliveries",
            "agent_session_stops",
        ):
            conn.execute(f"VACUUM ANALYZE {table}")  # (names of ours)
    if log:
        print(f"  seeded and analysed ({time.monotonic() - t0:.0f} s)", flush=True)
    return Year([Machine(r.id, hash_token(r.token)) for r in machines], n)


def _hook(body: dict[str, object]) -> linear.Webhook:
    return linear.parse(json.dumps(body).encode())


def workload(pool: Pool, settings: Settings, year: Year) -> dict[str, Any]:
    """What the service does, each kind a few times (see the module's docstring); what it found."""
    service = Dispatch(pool, settings)
    found: dict[str, Any] = {}
    try:
        m = year.machines
        # webhooks: starts, edits, a re-assignment, an agent session, a follow-up to its holder, a stop
        for i in range(20):
            user = f"u{i}"
            service.receive_webhook(_hook(assignment(f"new-{i}", f"NEW-{i}", user)), f"w-{i}")
            service.receive_webhook(_hook(edit(f"new-{i}", user)), f"e-{i}")
            service.receive_webhook(_hook(reassigned(f"new-{i}", user, f"u{i + 1}")), f"r-{i}")
            service.receive_webhook(_hook(agent_created(f"as-new-{i}", f"ai-{i}", user)), f"c-{i}")
        # machines at work: polls, claims, batch acks, a release; their agents speak
        for i, reg in enumerate(m[:5]):
            polled = queue.poll(pool, reg.token_hash, max=10, lease_seconds=600)
            got = (polled[1] if polled else []) + queue.claim(pool, reg.id, max=100, lease_seconds=600)
            if got:  # the oldest (a seeded start) given back; the others acked
                first = got[0]
                queue.release(pool, settings, reg.id, first.queue_id, first.claim_token, reason="bench")
            queue.ack_many(pool, reg.id, [AckItem(g.queue_id, g.claim_token) for g in got[1:]])
            while got:  # the rest of its queue, the webhooks' new work with it
                got = queue.claim(pool, reg.id, max=100, lease_seconds=600)
                queue.ack_many(pool, reg.id, [AckItem(g.queue_id, g.claim_token) for g in got])
            orch = Orchestrator(reg.id, ORG, f"u{i}", f"m{i}")
            agent = f"as-new-{i}"
            service.receive_webhook(_hook(prompted(agent, f"ai-{i}", f"u{i}")), f"p-{i}")
            for k in range(3):
                service.accept_activity(
                    orch, agent, {"type": "thought", "body": f"step {k}"}, activity_id=None, ephemeral=k < 2
                )
            service.accept_plan(orch, agent, [{"content": "read", "status": "completed"}])
            found.setdefault("transcript", len(service.activities_of(orch, agent)))
            if i % 2:  # stop pressed in some of them
                service.receive_webhook(_hook(stopped(agent, f"ai-{i}", f"u{i}")), f"s-{i}")
        # the sweep: expired leases, routing, posts to Linear, delivery records, retention
        service.sweep()
        # the operators: dashboard and `devpilot status`, a metrics scrape, pages and searches
        snap = status.snapshot(pool)
        status.snapshot(pool, with_sessions=False)
        found["totals"] = snap.totals
        with pool.connection() as conn:
            big = conn.execute(
                "SELECT id FROM dispatch_sessions WHERE agent_session_id = 'as-' || (%s / 3 + 1)::text LIMIT 1",
                (year.sessions // 2,),
            ).fetchone()
            failed = conn.execute(
                "SELECT id FROM dispatch_sessions WHERE status = 'failed' ORDER BY updated_at DESC LIMIT 1"
            ).fetchone()
            queued = conn.execute(
                "SELECT s.id, s.orchestrator_id FROM dispatch_sessions s JOIN dispatch_queue q ON q.session_id = s.id"
                " WHERE q.lease_expires_at IS NULL AND s.kind = 'start' AND s.orchestrator_id = %s LIMIT 2",
                (m[50].id,),
            ).fetchall()
        assert big is not None and failed is not None and len(queued) == 2
        page = sessions.read(pool, big["id"])
        found["page"] = None if page is None else len(page.messages)
        for q in ("ENG-4242", f"as-{year.sessions // 2 // 3}", "m7", str(big["id"]), None):
            found.setdefault("searches", []).append(len(sessions.search(pool, q)))
        for action, sid, target in (
            ("retry", failed["id"], None),
            ("cancel", queued[0]["id"], None),
            ("move", queued[1]["id"], m[51].id),
        ):
            try:
                service.act_on_session(sid, action, "bench", target)
            except sessions.NotAllowed as exc:
                found.setdefault("refused", []).append(f"{action}: {exc}")
        # a machine revoked with its queued work (its user has another machine: the starts move)
        register(pool, org_id=ORG, linear_user_id=f"u{len(m) - 1}", name=f"new-{time.time_ns()}")
        service.revoke(m[-1].id)
        service.sweep()
    finally:
        service.close()
    return found
