"""DEVPILOT_RETENTION_DAYS: the sweep forgets a finished conversation, whole, once its last change
is older than the retention, and never a live one, whatever its age (shared/operators/retention.py).

A property test over random conversations: agent sessions of several messages (start, follow-ups)
and plain assignments, each message queued, delivered, failed or cancelled and last changed some
days ago, with posts to Linear (sent, waiting, given up, replaced), routing requests (open, done),
claim records, dead letters and operators' actions; and posts and routing requests that belong to
no session. The expectation is written from the rule, not from the statements."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.operators import retention
from shared.plumbing.db import Pool, transaction
from shared.plumbing.settings import Settings
from tests.helpers.data import MakeOrch

DAYS = 90
AGES = (0.5, 30, 89, 91, 120, 400)  # days since the change

PARTS = {  # each table of a conversation, and how its rows name their conversation's tag
    "dispatch_sessions": "issue_identifier",
    "linear_notices": "body",
    "routing_requests": "issue_id",
    "dispatch_attempts": "error",
    "dead_letters": "reason",
    "session_actions": "detail",
}


@dataclass
class Message:
    status: str
    age: float
    attempts: int = 0  # claims that ended unacked
    actions: int = 0


@dataclass
class Post:
    state: str  # sent | waiting | given_up | replaced
    age: float
    sent_age: float | None = None
    of_message: int | None = None  # written for that message (session_id), else for the conversation
    named: bool = True  # carries the agent session (or a plain assignment's alias); else its session only


@dataclass
class Route:
    open: bool
    age: float


@dataclass
class Conversation:
    agent: bool
    messages: list[Message]
    posts: list[Post] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)

    def last_change(self) -> float:
        """Days since the last change: the youngest of every part's times."""
        ages = [m.age for m in self.messages] + [p.age for p in self.posts]
        ages += [p.sent_age for p in self.posts if p.sent_age is not None] + [r.age for r in self.routes]
        return min(ages)

    def live(self) -> bool:
        return (
            any(m.status == "queued" for m in self.messages)
            or any(p.state == "waiting" for p in self.posts)
            or any(r.open for r in self.routes)
        )

    def forgotten(self) -> bool:
        return not self.live() and self.last_change() > DAYS


ages = st.sampled_from(AGES)
messages = st.builds(
    Message,
    status=st.sampled_from(["queued", "delivered", "failed", "cancelled"]),
    age=ages,
    attempts=st.integers(0, 2),
    actions=st.integers(0, 1),
)


@st.composite
def posts(draw: st.DrawFn, n_messages: int) -> Post:
    state = draw(st.sampled_from(["sent", "waiting", "given_up", "replaced"]))
    age = draw(ages)
    sent_age = draw(st.sampled_from([a for a in AGES if a <= age])) if state == "sent" else None
    of = draw(st.none() | st.integers(0, n_messages - 1)) if n_messages else None
    return Post(state, age, sent_age, of, named=of is None or draw(st.booleans()))


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    agent = draw(st.booleans())
    n = draw(st.integers(0, 3)) if agent else 1  # (an agent session with no message: posts only)
    ms = [draw(messages) for _ in range(n)]
    ps = draw(st.lists(posts(n), max_size=3))
    rs = draw(st.lists(st.builds(Route, open=st.booleans(), age=ages), max_size=1)) if agent else []
    if not ms and not ps and not rs:
        ps = [Post("sent", 120, 120)]
    return Conversation(agent, ms, ps, rs)


def write(pool: Pool, machine: uuid.UUID, org: str, tag: str, c: Conversation) -> None:
    """The conversation's rows, each carrying `tag` (see PARTS), as the service writes them."""
    agent = f"as-{tag}" if c.agent else None
    ago = "now() - make_interval(secs => %(age)s * 86400)"
    with transaction(pool) as tx:
        ids = []
        for m in c.messages:
            p = {"org": org, "o": machine, "st": m.status, "agent": agent, "tag": tag, "age": m.age}
            row = tx.one(
                "INSERT INTO dispatch_sessions (org_id, orchestrator_id, status, agent_session_id,"
                " issue_identifier, kind, created_at, updated_at)"
                f" VALUES (%(org)s, %(o)s, %(st)s, %(agent)s, %(tag)s, 'start', {ago}, {ago}) RETURNING id",
                p,
            )
            assert row is not None
            ids.append(row["id"])
            if m.status == "queued":
                tx.execute(
                    "INSERT INTO dispatch_queue (session_id, orchestrator_id, org_id, payload, agent_session_id)"
                    " VALUES (%(s)s, %(o)s, %(org)s, '{}', %(agent)s)",
                    {"s": row["id"], "o": machine, "org": org, "agent": agent},
                )
            for k in range(m.attempts):
                tx.execute(
                    "INSERT INTO dispatch_attempts (session_id, attempt, error, ended_at)"
                    f" VALUES (%(s)s, %(k)s, %(tag)s, {ago})",
                    {"s": row["id"], "k": k + 1, "tag": tag, "age": m.age},
                )
            if m.status == "failed":
                tx.execute(
                    "INSERT INTO dead_letters (session_id, payload, attempts, reason, failed_at)"
                    f" VALUES (%(s)s, '{{}}', 5, %(tag)s, {ago})",
                    {"s": row["id"], "tag": tag, "age": m.age},
                )
            for _ in range(m.actions):
                tx.execute(
                    "INSERT INTO session_actions (session_id, action, actor, detail, at)"
                    f" VALUES (%(s)s, 'retry', 'op', %(tag)s, {ago})",
                    {"s": row["id"], "tag": tag, "age": m.age},
                )
        for post in c.posts:
            session = ids[post.of_message] if post.of_message is not None else None
            alias = (agent or (f"devpilot:{ids[0]}" if ids else None)) if post.named else None
            tx.execute(
                "INSERT INTO linear_notices (org_id, session_id, kind, agent_session_id, body, created_at,"
                " sent_at, available_at, ephemeral, superseded_by)"
                f" VALUES (%(org)s, %(s)s, 'activity', %(agent)s, %(tag)s, {ago},"
                "  CASE WHEN %(sent)s::float8 IS NOT NULL THEN now() - make_interval(secs => %(sent)s * 86400) END,"
                "  CASE WHEN %(state)s IN ('given_up', 'replaced') THEN 'infinity'::timestamptz"
                f"       ELSE {ago} END,"
                "  %(state)s = 'replaced', CASE WHEN %(state)s = 'replaced' THEN gen_random_uuid() END)",
                {
                    "org": org,
                    "s": session,
                    "agent": alias,
                    "tag": tag,
                    "age": post.age,
                    "sent": post.sent_age,
                    "state": post.state,
                },
            )
        for r in c.routes:
            tx.execute(
                "INSERT INTO routing_requests (org_id, agent_session_id, issue_id, need, message, created_at,"
                "  done_at, outcome)"
                f" VALUES (%(org)s, %(agent)s, %(tag)s, 'assignee', '{{}}', {ago},"
                f"  CASE WHEN %(open)s THEN NULL ELSE {ago} END,"
                "  CASE WHEN %(open)s THEN NULL ELSE 'no_machine' END)",
                {"org": org, "agent": agent, "tag": tag, "age": r.age, "open": r.open},
            )


def parts(pool: Pool, tag: str) -> dict[str, int]:
    with pool.connection() as conn:
        return {
            table: conn.execute(
                f"SELECT count(*) AS n FROM {table} WHERE {column} = %s",  # (names from PARTS above)
                (tag,),
            ).fetchone()["n"]  # type: ignore[index]
            for table, column in PARTS.items()
        }


OLD, NEW = 400, 30
FINISHED = [Message("delivered", OLD)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(conversations(), min_size=1, max_size=8), st.sampled_from([1, 3, 50]))
# The cases that matter, always tried: a live part of any kind, or a recent change, keeps an old
# conversation; posts that carry only their session go with it.
@example([Conversation(True, FINISHED, [], [Route(True, OLD)])], 3)
@example([Conversation(True, FINISHED, [Post("waiting", OLD)])], 3)
@example([Conversation(True, [Message("queued", OLD), Message("delivered", OLD)])], 1)
@example([Conversation(True, FINISHED, [Post("sent", NEW, NEW)])], 3)
@example([Conversation(True, FINISHED, [Post("sent", OLD, NEW)])], 3)
@example([Conversation(True, [Message("delivered", OLD), Message("failed", NEW)])], 1)
@example([Conversation(True, FINISHED, [], [Route(False, NEW)])], 3)
@example([Conversation(False, [Message("failed", OLD)], [Post("given_up", OLD, None, 0, named=False)])], 3)
@example([Conversation(True, FINISHED, [Post("sent", OLD, OLD, 0, named=False), Post("replaced", OLD)])], 3)
@example([Conversation(True, [], [Post("sent", OLD, OLD)], [Route(False, OLD)])], 3)
def test_retention_forgets_finished_old_conversations_whole_and_nothing_live(
    pool: Pool, make_orchestrator: MakeOrch, convs: list[Conversation], batch: int
) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"
    machine = make_orchestrator(org_id=org).id
    with pool.connection() as conn:  # each example on its own: no rows, the walks at their start
        conn.execute(
            "TRUNCATE linear_notices, routing_requests, dispatch_attempts, dead_letters, session_actions,"
            " dispatch_queue, dispatch_sessions"
        )
        conn.execute("UPDATE retention_cursors SET at = '-infinity'")
    tags = [f"{org}-{i}" for i in range(len(convs))]
    for tag, c in zip(tags, convs, strict=True):
        write(pool, machine, org, tag, c)
    before = {tag: parts(pool, tag) for tag in tags}
    policy = Settings(DEVPILOT_RETENTION_DAYS=DAYS)
    retention.forget(pool, policy, batch=batch, batches=1000)
    for tag, c in zip(tags, convs, strict=True):
        after = parts(pool, tag)
        if c.forgotten():
            assert after == dict.fromkeys(PARTS, 0), (c, before[tag], after)
        else:
            assert after == before[tag], (c, before[tag], after)


def test_no_retention_keeps_everything(pool: Pool, make_orchestrator: MakeOrch) -> None:
    machine = make_orchestrator(org_id="org-keep").id
    old = Conversation(True, [Message("delivered", 400)], [Post("sent", 400, 400)])
    write(pool, machine, "org-keep", "keep-1", old)
    assert retention.forget(pool, Settings(DEVPILOT_RETENTION_DAYS=0)) == retention.Forgotten()
    assert parts(pool, "keep-1")["dispatch_sessions"] == 1
    assert retention.forget(pool, Settings(DEVPILOT_RETENTION_DAYS=DAYS)).conversations == 1
    assert parts(pool, "keep-1") == dict.fromkeys(PARTS, 0)


def test_live_conversations_first_in_line_do_not_hold_the_walk_back(
    pool: Pool, make_orchestrator: MakeOrch
) -> None:
    """Old conversations kept because they are live (a post waiting for a disconnected workspace,
    say) come first in the walk: each sweep goes on from where the last stopped, so the finished
    ones behind them are reached, however many live ones there are."""
    machine = make_orchestrator(org_id="org-walk").id
    for i in range(6):
        write(
            pool,
            machine,
            "org-walk",
            f"live-{i}",
            Conversation(True, [Message("delivered", 500)], [Post("waiting", 500)]),
        )
    for i in range(3):
        write(pool, machine, "org-walk", f"done-{i}", Conversation(True, [Message("delivered", 200)]))
    policy = Settings(DEVPILOT_RETENTION_DAYS=DAYS)
    for _ in range(4):  # sweeps that each look at four sessions of each walk
        retention.forget(pool, policy, batch=2, batches=2)
    assert all(parts(pool, f"done-{i}")["dispatch_sessions"] == 0 for i in range(3))
    assert all(parts(pool, f"live-{i}")["dispatch_sessions"] == 1 for i in range(6))
