"""Work is never stranded on a machine that went away: a revoke moves its undelivered starts to the
same user's most recently seen machine (or cancels them, telling Linear), and the sweep moves
unclaimed starts of a machine quiet for DEVPILOT_REROUTE_AFTER_SECONDS."""

from __future__ import annotations

import threading
from typing import Any
from uuid import UUID

import pytest

from shared.delivery.models import DispatchPayload
from shared.delivery.queue import claim, enqueue_dispatch, sweep
from shared.plumbing.db import transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.wire.messages import IssueRef
from tests.helpers.api import Api, agent_session_event, issue_event
from tests.helpers.data import follow_up_in
from tests.helpers.linear import Linear
from tests.test_reliability import assert_invariant


def statuses(api: Api) -> dict[str, str]:
    with api.pool.connection() as conn:
        return {str(r["id"]): r["status"] for r in conn.execute("SELECT id, status FROM dispatch_sessions")}


def seen(api: Api, oid: str, seconds_ago: int) -> None:
    with api.pool.connection() as conn:
        conn.execute(
            "UPDATE orchestrators SET last_seen_at = now() - make_interval(secs => %s) WHERE id = %s",
            (seconds_ago, oid),
        )


def test_revoke_moves_starts_to_the_users_other_machine_and_cancels_the_rest(
    api: Api, linear: Linear
) -> None:
    laptop_id, laptop = api.register(user="user-1", name="laptop")
    queued = api.webhook(issue_event(issue_id="iss-q")).json()
    api.webhook(agent_session_event(session_id="as-r1"))
    claimed = {m["sessionId"] for m in api.claim_all(laptop)}  # both now claimed by the laptop
    api.webhook(issue_event(issue_id="iss-q2"))
    desk_id, desk = api.register(user="user-1", name="desktop")
    seen(api, desk_id, 5)
    # an agent session the laptop already holds: its follow-up stays the laptop's
    api.webhook(agent_session_event(session_id="as-r2"))
    with api.pool.connection() as conn:  # (routed by recency: make sure the laptop holds it)
        conn.execute(
            "UPDATE dispatch_queue SET orchestrator_id = %s WHERE agent_session_id = 'as-r2'", (laptop_id,)
        )
        conn.execute(
            "UPDATE dispatch_sessions SET orchestrator_id = %s WHERE agent_session_id = 'as-r2'", (laptop_id,)
        )
    [start] = [m for m in api.claim_all(laptop) if m["agentSessionId"] == "as-r2"]
    api.post_as(laptop, "/ack", {"queueId": start["queueId"], "claimToken": start["claimToken"]})
    follow = api.webhook(agent_session_event(session_id="as-r2", action="prompted", body="more")).json()
    assert follow["kind"] == "prompt" and follow["orchestratorId"] == laptop_id

    r = api.http.post(f"/orchestrators/{laptop_id}/revoke", headers=api.admin()).json()
    assert (r["moved"], r["cancelled"]) == (3, 1)
    got = api.claim_all(desk)
    assert {m["sessionId"] for m in got} >= claimed | {queued["sessionId"]}  # claimed ones too, at once
    assert all(m["orchestratorId"] == desk_id for m in got)
    assert statuses(api)[follow["sessionId"]] == "cancelled"
    assert_invariant(api.pool)


def test_revoke_with_no_other_machine_cancels_and_tells_linear(api: Api, linear: Linear) -> None:
    oid, _ = api.register(user="user-1")
    colleague_id, _ = api.register(user="user-2")  # another user's machine: never a target
    api.register(org="org-b", user="user-1")  # the same user in another workspace: never a target
    seen(api, colleague_id, 1)
    plain = api.webhook(issue_event(issue_id="iss-alone")).json()
    agent = api.webhook(agent_session_event(session_id="as-alone")).json()
    linear.wait(1)  # "queued for"
    r = api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin()).json()
    assert (r["moved"], r["cancelled"]) == (0, 2)
    assert statuses(api)[plain["sessionId"]] == statuses(api)[agent["sessionId"]] == "cancelled"
    linear.wait(2)
    [error] = [a for a in linear.activities() if a["content"]["type"] == "error"]
    assert error["agentSessionId"] == "as-alone" and "removed" in error["content"]["body"]
    with api.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM dispatch_queue").fetchone() == {"n": 0}  # not stranded
    assert api.http.post(f"/orchestrators/{oid}/revoke", headers=api.admin()).json()["cancelled"] == 0


def test_the_sweep_moves_a_quiet_machines_unclaimed_starts(api: Api) -> None:
    quiet_id, quiet = api.register(user="user-1", name="laptop")
    waiting = api.webhook(issue_event(issue_id="iss-w")).json()
    held = api.webhook(issue_event(issue_id="iss-h")).json()
    assert held["sessionId"] in {m["sessionId"] for m in api.claim_all(quiet)}
    with api.pool.connection() as conn:  # put the waiting one back: only `held` stays claimed
        conn.execute(
            "UPDATE dispatch_queue SET lease_expires_at = NULL WHERE session_id = %s", (waiting["sessionId"],)
        )
    desk_id, desk = api.register(user="user-1", name="desktop")
    seen(api, quiet_id, 700)
    seen(api, desk_id, 3)
    # DEVPILOT_REROUTE_AFTER_SECONDS=0 means never, even for a machine quiet this long
    assert sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=0)).rerouted == 0
    assert api.claim_all(desk) == []
    result = sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600))
    assert result.rerouted == 1
    [moved] = api.claim_all(desk)
    assert moved["sessionId"] == waiting["sessionId"] and moved["attempt"] == 2
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT orchestrator_id FROM dispatch_queue WHERE session_id = %s", (held["sessionId"],)
        ).fetchone()
    assert row is not None and str(row["orchestrator_id"]) == quiet_id  # a claimed row never moves


def test_reroute_racing_a_late_claim_by_the_quiet_machine(api: Api) -> None:
    """300 unclaimed starts of a quiet laptop; the sweep moves them while the laptop wakes and
    claims: each is claimed exactly once, by one machine or the other, none is lost."""
    quiet_id, _ = api.register(user="user-1", name="laptop")
    for n in range(300):
        api.webhook(issue_event(issue_id=f"iss-race-{n}"))
    desk_id, _ = api.register(user="user-1", name="desktop")
    seen(api, quiet_id, 700)
    seen(api, desk_id, 1)
    got: dict[str, list[str]] = {quiet_id: [], desk_id: []}
    start = threading.Barrier(3)
    swept = threading.Event()

    def drain(oid: str) -> None:
        # Claims race the move from the start; each machine stops once the move has committed and
        # it then finds nothing (not after a fixed number of tries: a slow move is not a lost row).
        start.wait()
        while True:
            moved = swept.is_set()
            batch = claim(api.pool, UUID(oid), max=5, lease_seconds=600)
            got[oid] += [str(m.session_id) for m in batch]
            if moved and not batch:
                return

    swept_with: list[Any] = []

    def reroute() -> None:
        start.wait()
        try:
            swept_with.append(sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)))
        finally:
            swept.set()

    threads = [threading.Thread(target=drain, args=(o,)) for o in (quiet_id, desk_id)]
    threads.append(threading.Thread(target=reroute))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    everything = got[quiet_id] + got[desk_id]
    assert len(swept_with) == 1  # the move ran to its end
    assert len(everything) == len(set(everything)) == 300
    assert len(got[desk_id]) == swept_with[0].rerouted  # the desktop got exactly what was moved to it
    assert_invariant(api.pool)


def test_a_follow_up_committing_while_its_start_is_rerouted_goes_with_it(api: Api) -> None:
    """A quiet laptop's unclaimed agent-session start, and a follow-up for it being written at
    that moment (its transaction holds the agent session's turn and has queued the prompt for the
    laptop, which holds the conversation). The sweep must not move the start without the prompt:
    the desktop would have a conversation without its follow-up, and the laptop, on waking, a
    follow-up of a conversation it never started. It leaves that start for the next sweep, which
    moves both."""
    quiet_id, _ = api.register(user="user-1", name="laptop")
    start = api.webhook(agent_session_event(session_id="as-moving")).json()
    assert start["orchestratorId"] == quiet_id
    desk_id, desk = api.register(user="user-1", name="desktop")
    seen(api, quiet_id, 700)
    seen(api, desk_id, 1)
    with transaction(api.pool) as follow_up:
        follow_up_in(follow_up, "as-moving", quiet_id)
        assert sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)).rerouted == 0
    assert sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)).rerouted == 2
    [first] = api.claim_all(desk)
    assert first["sessionId"] == start["sessionId"]
    api.post_as(desk, "/ack", {"queueId": first["queueId"], "claimToken": first["claimToken"]})
    [then] = api.claim_all(desk)
    assert then["kind"] == "prompt" and then["agentSessionId"] == "as-moving"
    with api.pool.connection() as conn:
        left = conn.execute(
            "SELECT count(*) AS n FROM dispatch_queue WHERE orchestrator_id = %s", (quiet_id,)
        )
        assert left.fetchone() == {"n": 0}
    assert_invariant(api.pool)


def test_the_reroute_takes_the_turns_of_the_starts_it_moves_and_no_others(api: Api) -> None:
    """The reroute holds the turn of each agent session whose start it moves, to its commit. It must
    take no other: not those of the quiet machine's follow-ups, nor of other machines' work. Were
    the condition checked on every row its scan reads, a large queue would fill the server's lock
    table (every sweep then failing at the move), and every such conversation's webhooks would wait
    for the sweep."""
    quiet_id, _ = api.register(user="user-1", name="laptop")
    api.webhook(agent_session_event(session_id="as-moves"))
    held = api.webhook(agent_session_event(session_id="as-held")).json()
    with transaction(api.pool) as tx:  # delivered: it stays, and so do its follow-ups
        tx.execute("DELETE FROM dispatch_queue WHERE session_id = %(id)s", {"id": held["sessionId"]})
        tx.execute(
            "UPDATE dispatch_sessions SET status = 'delivered' WHERE id = %(id)s", {"id": held["sessionId"]}
        )
    for n in range(30):
        api.webhook(agent_session_event(session_id="as-held", action="prompted", body=f"and {n}"))
    colleague_id, _ = api.register(user="user-2", name="colleague")
    for n in range(30):
        api.webhook(agent_session_event(session_id=f"as-busy-{n}", creator="user-2"))
    desk_id, _ = api.register(user="user-1", name="desktop")
    seen(api, quiet_id, 700)
    seen(api, desk_id, 1)
    seen(api, colleague_id, 1)
    with api.pool.connection() as conn:
        conn.execute("ANALYZE dispatch_queue")
        conn.execute("ANALYZE dispatch_sessions")
    with transaction(api.pool) as tx:
        picked = tx.all(query("reroute_quiet_pick"), {"after": 600, "batch": 100})
        locks = tx.one(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
    assert [r["agent_session_id"] for r in picked] == ["as-moves"]
    assert locks is not None and locks["n"] == 1


def test_a_quiet_machines_work_never_moves_to_another_user_or_org(api: Api) -> None:
    """Only the same user's machine in the same org may take over: another user's busy desktop in
    the org, or the same user's machine in another workspace, never gets the work."""
    quiet_id, quiet = api.register(org="org-a", user="user-1", name="laptop")
    waiting = api.webhook(issue_event(issue_id="iss-stay")).json()
    colleague_id, colleague = api.register(org="org-a", user="user-2", name="colleague")
    elsewhere_id, elsewhere = api.register(org="org-b", user="user-1", name="other-workspace")
    seen(api, quiet_id, 700)
    seen(api, colleague_id, 1)
    seen(api, elsewhere_id, 1)
    assert sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)).rerouted == 0
    assert api.claim_all(colleague) == [] and api.claim_all(elsewhere) == []
    [still] = api.claim_all(quiet)
    assert still["sessionId"] == waiting["sessionId"]


def _holder(api: Api, session_id: str) -> str:
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT orchestrator_id FROM dispatch_queue WHERE session_id = %s", (session_id,)
        ).fetchone()
    assert row is not None
    return str(row["orchestrator_id"])


def test_the_sweep_moves_work_only_from_a_quiet_machine_to_a_live_one_the_freshest(api: Api) -> None:
    """Rerouting needs both: the holder quiet for DEVPILOT_REROUTE_AFTER_SECONDS, and a machine of the
    same user seen within it (not revoked). Among several, the most recently seen takes the work."""
    reroute = Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)
    laptop_id, _ = api.register(user="user-1", name="laptop")
    work = api.webhook(issue_event(issue_id="iss-r")).json()["sessionId"]
    desk_id, _ = api.register(user="user-1", name="desktop")
    spare_id, _ = api.register(user="user-1", name="spare")

    # Both of the user's other machines quiet too, and the laptop quiet: nowhere better to go.
    seen(api, laptop_id, 700)
    seen(api, desk_id, 650)
    seen(api, spare_id, 900)
    assert sweep(api.pool, reroute).rerouted == 0 and _holder(api, work) == laptop_id

    # The laptop itself seen recently: it is not quiet, whoever else is live.
    seen(api, laptop_id, 5)
    seen(api, desk_id, 1)
    assert sweep(api.pool, reroute).rerouted == 0 and _holder(api, work) == laptop_id

    # A live machine of the user, but revoked: never a target.
    seen(api, laptop_id, 700)
    seen(api, desk_id, 650)
    with api.pool.connection() as conn:
        conn.execute(
            "UPDATE orchestrators SET revoked_at = now(), last_seen_at = now() WHERE id = %s", (spare_id,)
        )
    assert sweep(api.pool, reroute).rerouted == 0 and _holder(api, work) == laptop_id

    # Two live candidates: the most recently seen one. Nobody else's work moves with it.
    third_id, _ = api.register(user="user-1", name="third")
    bystander_id, _ = api.register(user="user-9", name="bystander")
    other_work = api.webhook(issue_event(issue_id="iss-b", assignee="user-9")).json()["sessionId"]
    seen(api, desk_id, 300)
    seen(api, third_id, 2)
    seen(api, bystander_id, 1)
    assert sweep(api.pool, reroute).rerouted == 1 and _holder(api, work) == third_id
    assert _holder(api, other_work) == bystander_id
    with api.pool.connection() as conn:  # the session follows its row, and only that session
        rows = conn.execute(
            "SELECT id::text AS id, orchestrator_id::text AS owner FROM dispatch_sessions WHERE id = ANY(%s::uuid[])",
            ([work, other_work],),
        ).fetchall()
    owners = {r["id"]: r["owner"] for r in rows}
    assert owners == {work: third_id, other_work: bystander_id}


def test_revoke_hands_the_work_to_the_users_most_recently_seen_machine(api: Api) -> None:
    """Among the user's other active machines: the most recently seen; machines never seen come
    after every seen one, the most recently registered first."""
    laptop_id, _ = api.register(user="user-1", name="laptop")
    first = api.webhook(issue_event(issue_id="iss-m1")).json()["sessionId"]
    old_id, _ = api.register(user="user-1", name="old")
    recent_id, _ = api.register(user="user-1", name="recent")
    seen(api, old_id, 300)
    seen(api, recent_id, 5)
    assert api.http.post(f"/orchestrators/{laptop_id}/revoke", headers=api.admin()).json()["moved"] == 1
    assert _holder(api, first) == recent_id

    # Nobody seen: the newest registration.
    with api.pool.connection() as conn:
        conn.execute("UPDATE orchestrators SET last_seen_at = NULL")
    second = api.webhook(issue_event(issue_id="iss-m2")).json()["sessionId"]
    holder = _holder(api, second)
    newer_id, _ = api.register(user="user-1", name="newer")
    newest_id, _ = api.register(user="user-1", name="newest")
    assert holder == recent_id  # (routed to it: it holds both now)
    assert api.http.post(f"/orchestrators/{holder}/revoke", headers=api.admin()).json()["moved"] == 2
    assert _holder(api, first) == _holder(api, second) == newest_id != newer_id


@pytest.mark.parametrize("mover", ["sweep", "revoke"])
def test_rerouted_work_wakes_the_new_machines_long_poll(api: Api, mover: str) -> None:
    """The move's NOTIFY (the sweep's, or the revoke's) wakes the machine that now holds the work:
    its open long-poll answers at once, not at its next re-check."""
    import threading
    import time

    from shared.dispatch import RECHECK_SECONDS

    quiet_id, _ = api.register(user="user-1", name="laptop")
    work = api.webhook(issue_event(issue_id="iss-wake")).json()["sessionId"]
    _, desk = api.register(user="user-1", name="desktop")
    seen(api, quiet_id, 700)
    out: list[Any] = []
    t = threading.Thread(
        target=lambda: out.append((api.post_as(desk, "/claim", {"waitSeconds": 20}).json(), time.monotonic()))
    )
    t.start()
    time.sleep(1.0)  # the desktop is waiting (its first look found nothing)
    moved_at = time.monotonic()
    if mover == "sweep":
        assert sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)).rerouted == 1
    else:
        assert api.http.post(f"/orchestrators/{quiet_id}/revoke", headers=api.admin()).json()["moved"] == 1
    t.join(timeout=25)
    answer, answered_at = out[0]
    assert [m["sessionId"] for m in answer["messages"]] == [work]
    assert answered_at - moved_at < RECHECK_SECONDS / 2  # woken by the move's NOTIFY


@pytest.mark.parametrize("mover", ["sweep", "revoke"])
def test_follow_ups_queued_behind_a_moved_start_go_with_it(api: Api, mover: str) -> None:
    """A user follows up twice while the agent session's start still waits on a quiet laptop: the
    prompts are queued for the laptop, behind the start. When the start moves to the user's
    desktop, they move with it, in order — the laptop never hears of a conversation it was never
    given, and a revoke does not cancel them."""
    laptop_id, laptop = api.register(user="user-1", name="laptop")
    start = api.webhook(agent_session_event(session_id="as-move")).json()
    prompt = api.webhook(agent_session_event(session_id="as-move", action="prompted", body="also X")).json()
    again = api.webhook(agent_session_event(session_id="as-move", action="prompted", body="and Y")).json()
    assert prompt["orchestratorId"] == again["orchestratorId"] == laptop_id  # behind the start
    desk_id, desk = api.register(user="user-1", name="desktop")
    seen(api, laptop_id, 700)
    seen(api, desk_id, 3)
    if mover == "sweep":
        assert sweep(api.pool, Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)).rerouted == 3
    else:
        r = api.http.post(f"/orchestrators/{laptop_id}/revoke", headers=api.admin()).json()
        assert (r["moved"], r["cancelled"]) == (3, 0)

    got: list[tuple[str, str]] = []
    for _ in range(5):
        for m in api.claim_all(desk):
            if m["agentSessionId"] == "as-move":
                got.append((m["kind"], m["sessionId"]))
            api.post_as(desk, "/ack", {"queueId": m["queueId"], "claimToken": m["claimToken"]})
    assert got == [
        ("start", start["sessionId"]),
        ("prompt", prompt["sessionId"]),
        ("prompt", again["sessionId"]),
    ]
    if mover == "sweep":
        assert api.claim_all(laptop) == []  # nothing of as-move reaches the laptop
    statuses_now = statuses(api)
    assert {statuses_now[x["sessionId"]] for x in (start, prompt, again)} == {"delivered"}
    nxt = api.webhook(agent_session_event(session_id="as-move", action="prompted", body="and Z")).json()
    assert nxt["orchestratorId"] == desk_id  # the desktop holds the conversation now
    assert_invariant(api.pool)


def test_the_sweep_rescues_work_left_on_a_revoked_machine(api: Api) -> None:
    """Work on a machine that is already revoked can never be claimed. A revoke moves what it sees,
    and an enqueue waits for it; but the sweep's own reroute can race a revoke of its target, and a
    database written before those locks may hold such rows. The sweep revokes the machine again:
    its starts go to the user's active machine, and work nobody can take is cancelled."""
    gone, _ = api.register(name="gone")
    other, other_token = api.register(name="other")
    lonely, _ = api.register(user="user-2", name="lonely")
    seen(api, other, 3600)  # (the webhook routes to `gone`, the most recently seen)
    with api.pool.connection() as conn:
        conn.execute("UPDATE orchestrators SET last_seen_at = now() WHERE id = %s", (gone,))
    moved = api.webhook(issue_event(issue_id="iss-moved")).json()
    alone = api.webhook(issue_event(issue_id="iss-alone", assignee="user-2")).json()
    assert (moved["orchestratorId"], alone["orchestratorId"]) == (gone, lonely)
    with api.pool.connection() as conn:  # as a raced revoke leaves them: revoked, rows still there
        conn.execute("UPDATE orchestrators SET revoked_at = now() WHERE id IN (%s, %s)", (gone, lonely))
    result = sweep(api.pool, Settings())
    assert result.rescued == 2
    assert [m["sessionId"] for m in api.claim_all(other_token)] == [moved["sessionId"]]
    assert statuses(api)[alone["sessionId"]] == "cancelled"
    assert sweep(api.pool, Settings()).rescued == 0  # nothing left to rescue
    assert_invariant(api.pool)


def test_the_sweep_moves_a_start_about_a_repository_only_to_a_machine_that_has_it(api: Api) -> None:
    """A start routed by repository stays on its quiet machine rather than move to a live one that
    lacks the repository (which would only give it back); once a live one has it, it moves there.
    A start that names no repository moves as before."""
    from shared.plumbing.db import transaction
    from shared.wire.messages import Repository

    reroute = Settings(DEVPILOT_REROUTE_AFTER_SECONDS=600)
    laptop_id, _ = api.register(user="user-1", name="laptop")
    desk_id, desk = api.register(user="user-1", name="desktop")
    backend = {"hostname": "github.com", "fullName": "acme/backend"}
    assert (
        api.post_as(
            desk, "/machine", {"repositories": [{"hostname": "github.com", "fullName": "acme/web"}]}
        ).status_code
        == 200
    )
    with transaction(api.pool) as tx:
        about = enqueue_dispatch(
            tx, org_id="org-a", orchestrator_id=UUID(laptop_id), linear_user_id="user-1",
            message=DispatchPayload(issue=IssueRef(id="iss-repo"), repository=Repository.from_wire(backend)),
        )  # fmt: skip
        plain = enqueue_dispatch(
            tx, org_id="org-a", orchestrator_id=UUID(laptop_id), linear_user_id="user-1",
            message=DispatchPayload(issue=IssueRef(id="iss-plain")),
        )  # fmt: skip
    seen(api, laptop_id, 700)
    seen(api, desk_id, 1)
    assert sweep(api.pool, reroute).rerouted == 1
    assert (_holder(api, str(about.session_id)), _holder(api, str(plain.session_id))) == (laptop_id, desk_id)
    assert api.post_as(desk, "/machine", {"repositories": [backend]}).status_code == 200
    seen(api, desk_id, 1)
    assert sweep(api.pool, reroute).rerouted == 1 and _holder(api, str(about.session_id)) == desk_id
