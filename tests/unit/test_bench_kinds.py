"""The bench's webhooks (bench/loadgen.py) are the kinds they say, as the service reads them, and
the README's table shows every kind (bench/table.py). The bench itself runs against the service
(bench/run); here, what can be checked without it."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from bench import floor, loadgen, paired, table
from bench.loadgen import BLEND, KINDS, USER_A, USER_B, bodies, check, pool_id, prepared
from shared.linear.webhooks import Intent, intent, parse
from tests.helpers.linear import payload_errors


def sent(kind: str, n: int, *, thread: int = 0, threads: int = 16, seconds: float = 1.0) -> list[Any]:
    """The first n webhooks one sender of `kind` sends: (kind, event, what the service reads)."""
    nxt = bodies(kind, "t", thread, threads, seconds)
    out = []
    for _ in range(n):
        k, body = nxt()
        out.append((k, json.loads(body), intent(parse(body))))
    return out


def test_each_kind_is_read_as_the_kind_it_is() -> None:
    plans: dict[str, Intent] = {kind: sent(kind, 1)[0][2] for kind in KINDS}
    created, existing = plans["created"], plans["existing"]
    assert (created.kind, created.user_id, created.cancel_issue_id) == ("dispatch", USER_A, None)
    # An issue that was unassigned until now: a start, through the path that may cancel first.
    assert (existing.kind, existing.user_id) == ("dispatch", USER_A)
    [(_, event, _)] = sent("existing", 1)
    assert event["updatedFrom"] == {"assigneeId": None}
    moved = plans["reassigned"]
    assert (moved.kind, moved.user_id, moved.cancel_issue_id) == (
        "dispatch",
        USER_B,
        pool_id("t", "reassigned", "reassigned", 0),
    )
    gone = plans["unassigned"]
    assert (gone.kind, gone.cancel_issue_id) == ("cancel", pool_id("t", "unassigned", "unassigned", 0))
    started = plans["agent_created"]
    assert (started.kind, started.user_id) == ("dispatch", USER_A) and started.agent_session_id
    assert started.prompt is not None and started.prompt.body == "@agent fix the flaky test"
    follow = plans["prompted"]
    assert (follow.kind, follow.agent_session_id) == ("prompt", pool_id("t", "prompted", "prompted", 0))
    assert follow.prompt is not None and follow.prompt.body == "also the docs"
    stop = plans["stop"]
    assert (stop.kind, stop.agent_session_id) == ("stop", pool_id("t", "stop", "stop", 0))
    assert (plans["edit"].kind, plans["edit"].reason) == ("ignore", "assignee_unchanged")


def test_the_bodies_are_shaped_as_linears() -> None:
    for kind in KINDS:
        [(_, event, _)] = sent(kind, 1)
        if event["type"] == "Issue":
            assert payload_errors("IssueWebhookPayload", event["data"]) == [], kind
        else:
            assert payload_errors("AgentSessionEventWebhookPayload", event) == [], kind


def test_every_webhook_is_a_delivery_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two webhooks with the same delivery identity would be answered `duplicate` (and fail), the
    same issue re-assigned again or the same agent session prompted again included."""
    monkeypatch.setattr(loadgen, "MAX_REUSED", {"prompted": 4, "stop": 4, "reassigned": 4})
    for kind in (*KINDS, "blend"):
        keys = [
            parse(json.dumps(e).encode()).delivery_keys(None)[1] for _, e, _ in sent(kind, 300, threads=1)
        ]
        assert len(set(keys)) == len(keys), kind


def test_the_blend_sends_its_stated_mix_and_each_sender_starts_elsewhere_in_it() -> None:
    assert sum(BLEND.values()) == 100 and set(BLEND) == set(KINDS) - {"stop"}
    first = sent("blend", 100, thread=0)
    assert Counter(k for k, _, _ in first) == Counter(BLEND)
    assert [k for k, _, _ in sent("blend", 10, thread=1)] != [k for k, _, _ in first[:10]]
    for k, _, plan in first:
        assert plan.kind == {"edit": "ignore", "unassigned": "cancel", "prompted": "prompt"}.get(
            k, "dispatch"
        )


def test_a_reassigned_issue_goes_back_when_its_share_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen, "MAX_RATE", 4)  # (2 issues for each of 2 threads)
    assert prepared("reassigned", 2, 1.0) == {"reassigned": 4}
    plans = [plan for _, _, plan in sent("reassigned", 5, thread=1, threads=2)]
    ids = [pool_id("t", "reassigned", "reassigned", i) for i in (1, 3)]
    assert [(p.cancel_issue_id, p.user_id) for p in plans] == [
        (ids[0], USER_B),
        (ids[1], USER_B),
        (ids[0], USER_A),
        (ids[1], USER_A),
        (ids[0], USER_B),
    ]


def test_unassigned_issues_run_out_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen, "MAX_RATE", 4)
    with pytest.raises(RuntimeError, match="ran out"):
        sent("unassigned", 3, thread=0, threads=2)


def test_prepared_pools_are_shared_evenly_and_sized_for_the_run() -> None:
    for kind in (*KINDS, "blend"):
        for n in prepared(kind, 16, 5.0).values():
            assert n % 16 == 0
    assert prepared("unassigned", 16, 5.0)["unassigned"] >= loadgen.MAX_RATE * 5
    assert prepared("prompted", 16, 5.0)["prompted"] <= loadgen.MAX_REUSED["prompted"]
    assert set(prepared("blend", 16, 1.0)) == {"reassigned", "unassigned", "prompted"}
    assert prepared("created", 16, 5.0) == {}


@pytest.mark.parametrize(
    ("kind", "answer", "ok"),
    [
        ("created", {"status": "dispatched"}, True),
        ("created", {"status": "ignored", "reason": "no_orchestrator"}, False),
        ("existing", {"status": "dispatched", "cancelledSessionId": "x"}, False),
        ("reassigned", {"status": "dispatched", "cancelledSessionId": "x"}, True),
        ("reassigned", {"status": "dispatched"}, False),  # nothing was cancelled: not a re-assignment
        ("unassigned", {"status": "cancelled"}, True),
        ("unassigned", {"status": "ignored", "reason": "nothing_to_cancel"}, False),
        ("agent_created", {"status": "dispatched", "kind": "start"}, True),
        ("prompted", {"status": "dispatched", "kind": "prompt"}, True),
        ("prompted", {"status": "dispatched", "kind": "start"}, False),  # nobody held it
        ("stop", {"status": "stopped", "stopSessionId": "x"}, True),
        ("stop", {"status": "ignored"}, False),
        ("stop", {"status": "stopped", "stopSessionId": None}, False),  # nobody held it
        ("edit", {"status": "ignored"}, True),
        ("edit", {"status": "duplicate"}, False),
    ],
)
def test_a_wrong_answer_is_a_bench_error(kind: str, answer: dict[str, str], ok: bool) -> None:
    body = json.dumps(answer).encode()
    if ok:
        check(kind, 200, body)
    else:
        with pytest.raises(AssertionError):
            check(kind, 200, body)


def test_the_readme_table_has_a_row_for_every_kind() -> None:
    lib = [{"enqueue": 3000.0, "enqueue_one_statement": 4000.0, "drain": 1200.0}] * 3
    run = {"rate": 2000.0, "count": 6000, "p50_ms": 7.0, "p99_ms": 20.0, "cpu_s": 0.6}
    kinds = {k: paired._kind(lib, [run] * 3) for k in paired.WEBHOOK_KINDS}
    blend = {**run, "kinds": {k: {"count": w, "p50_ms": 5.0} for k, w in BLEND.items()}}
    kinds["blend"] = paired._kind(lib, [blend] * 3)
    assert kinds["created"]["vs_enqueue_one_statement"]["median"] == 0.5
    assert kinds["blend"]["per_kind"]["edit"] == {"count": 3 * 84, "p50_ms": 5.0}
    out = {
        "paired": {
            "rounds": 3,
            "clients": 16,
            "kind_seconds": 3.0,
            "webhooks_vs_library_enqueue_one_statement": kinds["created"]["vs_enqueue_one_statement"],
            "claim_ack_vs_library_drain": paired._summary([(1200.0, 700.0)] * 3),
            "kinds": kinds,
        }
    }
    md = table.markdown(out)
    for label in table.LABELS.values():
        assert f"| {label} | 2,000/s, p50 7.0 ms | 0.5× (0.5–0.5) |" in md
    assert "| blend, per 100 webhooks: 84 edit, 4 created" in md
    assert "| 4,000 msg/s (median of rounds) | 1× |" in md
    before = {"paired": {k: v for k, v in out["paired"].items() if k != "kinds"}}  # (a run before the kinds)
    assert f"| {table.LABELS['created']} | 2,000/s | 0.5× (0.5–0.5) |" in table.markdown(before)


def test_the_readme_table_shows_issue_starts_beside_the_floor() -> None:
    # (chosen so that the median of the rounds' own ratios differs from the ratio of the medians:
    # a round's rates are compared with each other, not with another round's)
    rounds = [
        {"library": 1000.0, "devpilot serve": 500.0, "floor": 1000.0},
        {"floor": 500.0, "library": 3000.0, "devpilot serve": 450.0},
        {"devpilot serve": 900.0, "library": 2000.0, "floor": 600.0},
    ]
    result = floor.summary(rounds, {"devpilot serve": [0.6, 0.7, 0.65], "floor": [0.3, 0.35, 0.32]}, 3.0)
    assert result["vs_library"] == {
        "devpilot serve": 0.45,
        "floor": 0.3,
    }  # (0.5, 0.15, 0.45: not 500 / 2,000)
    assert result["vs_floor"] == {"devpilot serve": 0.9, "floor": 1.0}  # (not 500 / 600 = 0.83)
    assert result["median_rate"] == {"library": 2000, "devpilot serve": 500, "floor": 600}
    assert result["server_cpu_ms"] == {"devpilot serve": 0.65, "floor": 0.32}
    md = table.markdown({"floor": result})
    assert "| issue created, `devpilot serve` / the bare server of `bench.floor`" in md
    assert "| 500 / 600/s | 0.45×; 0.9× the bare server |" in md
    assert "bench.floor" not in table.markdown({})  # (runs before 2026-12-08 have no floor)
