"""Paired rounds: each HTTP rate beside the library rate it is judged against, back to back.

A machine's speed drifts between figures taken minutes apart (a neighbour on the host, a checkpoint
of Postgres), and the rest of the bench measures each rate once: the ratio of two such figures moved
by up to a sixth between runs of the same code. Here each round measures the library's rates and the
HTTP rates one after the other, alternating which side goes first. The library's rates are each
taken on a fresh database after a CHECKPOINT. Over HTTP, one `devpilot serve` on a fresh database
takes every kind of webhook a workspace sends (`bench.loadgen.KINDS`, and their blend), each after
a CHECKPOINT, in an order that turns by one kind every round, so no kind always goes first (or
last, on the fullest tables); then the claim+ack cycles. Each ratio is the median of its rounds'
ratios, given with their range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import psycopg

from bench import core, http, loadgen
from bench.db import BenchServer

WEBHOOK_KINDS = (*loadgen.KINDS, "blend")
WARM_UP_SECONDS = 1.0  # the blend, untimed, before the first timed kind: the server's pool filled


def _checkpoint(s: BenchServer) -> None:
    """Every measurement starts just after a checkpoint, so none pays for one the other did not
    (a checkpoint's first writes to each page log the whole page)."""
    with psycopg.connect(s.admin_url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def _library(s: BenchServer, secs: float, clients: int, n_drain: int) -> dict[str, float]:
    _checkpoint(s)
    block = core.enqueue_rate(s.fresh("pairenq"), clients, secs)
    _checkpoint(s)
    one = core.enqueue_rate(s.fresh("pairenq1"), clients, secs, one_statement=True)
    _checkpoint(s)
    drain = core.drain_rate(s.fresh("pairdrain"), n_drain, clients, 1)
    return {"enqueue": block, "enqueue_one_statement": one, "drain": drain}


def kind_order(r: int) -> list[str]:
    """Round r's order of the webhook kinds: the list turned by r."""
    k = r % len(WEBHOOK_KINDS)
    return [*WEBHOOK_KINDS[k:], *WEBHOOK_KINDS[:k]]


def warmed_up(server: http.Serve, clients: int, kind_secs: float, r: int) -> str:
    """Round r's state on `server`, made before anything is timed: what the re-assignments,
    unassignments and follow-ups of every kind find (tag `r{r}`, `kind_secs` of each at `clients`
    senders), then the blend, untimed, for the server's pool. Machine A's token."""
    machine_a, token = http.machines(server)[loadgen.USER_A]
    runs = [(kind, f"r{r}", kind_secs) for kind in WEBHOOK_KINDS] + [("blend", f"warm{r}", WARM_UP_SECONDS)]
    http.prepare(server.db_url, runs, clients, machine_a)
    http.loadgen("webhook", server.url, http.SECRET, clients, WARM_UP_SECONDS, "blend", f"warm{r}")
    return token


def _over_http(s: BenchServer, secs: float, kind_secs: float, clients: int, r: int) -> dict[str, Any]:
    """Every webhook kind (`kind_secs` each) and the claim+ack cycles (`secs`) through one
    `devpilot serve`: each kind's load generator answer, and `claim_ack_cycles`'s."""
    server = http.Serve(s.fresh("pairhttp"))
    out: dict[str, Any] = {}
    try:
        token = warmed_up(server, clients, kind_secs, r)
        for kind in kind_order(r):
            _checkpoint(s)
            out[kind] = http.loadgen("webhook", server.url, http.SECRET, clients, kind_secs, kind, f"r{r}")
        _checkpoint(s)  # (the cycles claim and ack what the webhooks queued)
        out["claim_ack_cycles"] = http.loadgen("cycle", server.url, token, clients, secs)
    finally:
        server.close()
    return out


def _summary(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    ratios = [h / max(1.0, lib) for lib, h in pairs]
    return {
        "median": round(statistics.median(ratios), 2),
        "min": round(min(ratios), 2),
        "max": round(max(ratios), 2),
        "pairs": [[round(lib), round(h)] for lib, h in pairs],
    }


def _median(xs: list[float | None]) -> float | None:
    known = [x for x in xs if x is not None]
    return round(statistics.median(known), 3) if known else None


def _kind(lib: list[dict[str, float]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One kind's figures over the rounds: its rate, latency and the load generator's CPU per
    webhook (medians), and its ratios to the library's enqueue as one statement and in a block."""
    rates = [float(x["rate"]) for x in runs]
    out: dict[str, Any] = {
        "rate": round(statistics.median(rates)),
        "p50_ms": _median([x["p50_ms"] for x in runs]),
        "p99_ms": _median([x["p99_ms"] for x in runs]),
        "load_generator_cpu_ms": _median([x["cpu_s"] * 1000 / max(1, x["count"]) for x in runs]),
        "vs_enqueue_one_statement": _summary(
            [(a["enqueue_one_statement"], h) for a, h in zip(lib, rates, strict=True)]
        ),
        "vs_enqueue": _summary([(a["enqueue"], h) for a, h in zip(lib, rates, strict=True)]),
    }
    if "kinds" in runs[0]:  # the blend: what each kind in it was, and its latency there
        out["mix"] = dict(loadgen.BLEND)
        out["per_kind"] = {
            k: {
                "count": sum(x["kinds"].get(k, {}).get("count", 0) for x in runs),
                "p50_ms": _median([x["kinds"].get(k, {}).get("p50_ms") for x in runs]),
            }
            for k in loadgen.BLEND
        }
    return out


def paired(
    s: BenchServer, rounds: int, secs: float, clients: int, n_drain: int, kind_secs: float | None = None
) -> dict[str, Any]:
    """`rounds` rounds of the library's rates and the HTTP rates at `clients` clients, and each
    HTTP/library ratio over them: every webhook kind (`kind_secs` each, `secs` unless given)
    against the enqueue as one statement and in a block, claim+ack cycles against the drain by
    `clients` claimers at batch 1. `webhooks_*` are the kind `created` (an issue created with an
    assignee), the one kind these rounds measured before the others were added."""
    kind_secs = secs if kind_secs is None else kind_secs
    lib: list[dict[str, float]] = []
    web: list[dict[str, Any]] = []
    for r in range(rounds):
        if r % 2 == 0:
            lib.append(_library(s, secs, clients, n_drain))
            web.append(_over_http(s, secs, kind_secs, clients, r))
        else:
            web.append(_over_http(s, secs, kind_secs, clients, r))
            lib.append(_library(s, secs, clients, n_drain))
    kinds = {kind: _kind(lib, [w[kind] for w in web]) for kind in WEBHOOK_KINDS}
    return {
        "rounds": rounds,
        "clients": clients,
        "seconds": secs,
        "kind_seconds": kind_secs,
        "webhooks_vs_library_enqueue": kinds["created"]["vs_enqueue"],
        "webhooks_vs_library_enqueue_one_statement": kinds["created"]["vs_enqueue_one_statement"],
        "claim_ack_vs_library_drain": _summary(
            [(a["drain"], float(b["claim_ack_cycles"]["rate"])) for a, b in zip(lib, web, strict=True)]
        ),
        "kinds": kinds,
    }


def drain_vs_pgqueuer(s: BenchServer, rounds: int, n: int) -> dict[str, Any]:
    """The library's drain of `n` rows by one claimer at batch 10 (`claim`, then `ack_many`) beside
    PgQueuer's drain of `n` jobs at batch 10 (its own worker, `peers.pgqueuer_rates`), in `rounds`
    rounds, each on fresh databases after a checkpoint, alternating which goes first."""
    from bench import peers

    pgq: list[float] = []
    ours: list[float] = []

    def pgqueuer() -> None:
        pgq.append(float(peers.pgqueuer_rates(s.fresh("pairpgq", False), n, batch=10)["drain_per_s"]))

    def claim_then_ack() -> None:
        ours.append(core.drain_rate(s.fresh("pairdrain10"), n, 1, 10))

    steps: list[Callable[[], None]] = [pgqueuer, claim_then_ack]
    for r in range(rounds):
        for step in steps if r % 2 == 0 else steps[::-1]:
            _checkpoint(s)
            step()
    return {
        "rounds": rounds,
        "n": n,
        "claim_then_ack_vs_pgqueuer": _summary(list(zip(pgq, ours, strict=True))),
    }
