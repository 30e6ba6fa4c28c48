"""Paired rounds: each HTTP rate beside the library rate it is judged against, back to back.

A machine's speed drifts between figures taken minutes apart (a neighbour on the host, a checkpoint
of Postgres), and the rest of the bench measures each rate once: the ratio of two such figures moved
by up to a sixth between runs of the same code. Here each round measures the library's rates and the
HTTP rates one after the other, every one on a fresh database after a CHECKPOINT, alternating which
side goes first; each ratio is the median of its rounds' ratios, given with their range.
"""

from __future__ import annotations

import statistics
from typing import Any

import psycopg

from bench import core, http
from bench.db import BenchServer


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


def _over_http(s: BenchServer, secs: float, clients: int) -> dict[str, float]:
    server = http.Serve(s.fresh("pairhttp"))
    try:
        _, token = server.register()
        _checkpoint(s)
        hooks = http.loadgen("webhook", server.url, http.SECRET, clients, secs)
        _checkpoint(s)  # (the cycles claim and ack what the webhooks queued)
        cycles = http.loadgen("cycle", server.url, token, clients, secs)
    finally:
        server.close()
    return {"webhooks": float(hooks["rate"]), "claim_ack_cycles": float(cycles["rate"])}


def _summary(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    ratios = [h / max(1.0, lib) for lib, h in pairs]
    return {
        "median": round(statistics.median(ratios), 2),
        "min": round(min(ratios), 2),
        "max": round(max(ratios), 2),
        "pairs": [[round(lib), round(h)] for lib, h in pairs],
    }


def paired(s: BenchServer, rounds: int, secs: float, clients: int, n_drain: int) -> dict[str, Any]:
    """`rounds` rounds of the library's rates and the HTTP rates at `clients` clients, and each
    HTTP/library ratio over them: webhooks against the enqueue in a block and as one statement,
    claim+ack cycles against the drain by `clients` claimers at batch 1."""
    lib: list[dict[str, float]] = []
    web: list[dict[str, float]] = []
    for r in range(rounds):
        if r % 2 == 0:
            lib.append(_library(s, secs, clients, n_drain))
            web.append(_over_http(s, secs, clients))
        else:
            web.append(_over_http(s, secs, clients))
            lib.append(_library(s, secs, clients, n_drain))
    return {
        "rounds": rounds,
        "clients": clients,
        "webhooks_vs_library_enqueue": _summary(
            [(a["enqueue"], b["webhooks"]) for a, b in zip(lib, web, strict=True)]
        ),
        "webhooks_vs_library_enqueue_one_statement": _summary(
            [(a["enqueue_one_statement"], b["webhooks"]) for a, b in zip(lib, web, strict=True)]
        ),
        "claim_ack_vs_library_drain": _summary(
            [(a["drain"], b["claim_ack_cycles"]) for a, b in zip(lib, web, strict=True)]
        ),
    }
