"""The full runs of `bench/run`, one record a line in bench/results/history.jsonl, newest first.

    python -m bench.history                          the runs as a markdown table
    python -m bench.history add RESULTS NOTE [SPEED] a run's record, made from its results file
                                                     (`results/latest.json` copied to a dated name),
                                                     put first

A record holds what the README's table and bench/README.md compare across runs: the host (cores,
Python, Postgres, the commit baseline that says how fast it was, and a note on its speed), the
library's enqueue that every webhook ratio divides by, each kind's paired ratio, claim + ack over
HTTP, the drain beside PgQueuer's, the cold starts, the server's CPU and the instructions counted,
and one line on what the run was for. Everything else a run measured is in its results file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
HISTORY = RESULTS / "history.jsonl"
TARGETS = ("claim", "ack", "webhook", "healthz")


def _ratio(summary: dict[str, Any]) -> dict[str, float]:
    """A paired ratio without its pairs: median and range."""
    return {k: summary[k] for k in ("median", "min", "max")}


def figures(out: dict[str, Any]) -> dict[str, Any]:
    """The figures a record keeps, from a run's results (`results/latest.json` as `bench/run`
    wrote it; the keys an older run lacks are left out)."""
    http, peers, paired = out["http"], out["peers"], out.get("paired", {})
    f: dict[str, Any] = {
        "enqueue_16_per_s": {"block": out["enqueue"]["16"]},
        "webhooks_single": {
            "rate": round(http["webhooks"]["rate"]),
            "vs_enqueue": http["ratios"]["webhooks_vs_library_enqueue"],
        },
        "claim_ack_vs_drain": http["ratios"]["claim_ack_vs_library_drain"],
        "drain_vs_pgqueuer": peers["ratio_vs_pgqueuer"],
        "cold_start_ms": {t: out["cold_start"][t]["median_ms"] for t in TARGETS},
        "server_cpu_ms": {k: out["server_cpu_ms"][k] for k in ("empty_claim", "webhook", "healthz")},
    }
    f["cold_start_ms"]["max"] = max(out["cold_start"][t]["max_ms"] for t in TARGETS)
    if "bare_import" in out["cold_start"]:
        f["cold_start_ms"]["bare_import"] = out["cold_start"]["bare_import"]["median_ms"]
    if "enqueue_one_statement" in out:
        f["enqueue_16_per_s"]["one_statement"] = out["enqueue_one_statement"]["16"]
        f["webhooks_single"]["vs_enqueue_one_statement"] = http["ratios"][
            "webhooks_vs_library_enqueue_one_statement"
        ]
    if "webhooks_2_workers" in http:
        f["webhooks_single"]["two_workers_rate"] = round(http["webhooks_2_workers"]["rate"])
    if "cpu_ms_per_request" in http:
        f["cpu_ms_per_webhook"] = http["cpu_ms_per_request"]["webhooks"]
    if paired:
        # Paired rounds: each kind's median ratio to the one-statement enqueue, with its range
        # (before the kinds, the one kind sent was `created`).
        kinds = paired.get("kinds") or {
            "created": {"vs_enqueue_one_statement": paired["webhooks_vs_library_enqueue_one_statement"]}
        }
        enqueues = sorted(lib for lib, _ in paired["webhooks_vs_library_enqueue_one_statement"]["pairs"])
        f["paired"] = {
            "rounds": paired["rounds"],
            # What each ratio divides by: the library's one-statement enqueue, median of the rounds.
            "enqueue_one_statement_16_per_s": enqueues[len(enqueues) // 2],
            "vs_enqueue_one_statement": {k: _ratio(v["vs_enqueue_one_statement"]) for k, v in kinds.items()},
            "claim_ack_vs_drain": _ratio(paired["claim_ack_vs_library_drain"]),
        }
    if "paired_batch_10" in peers:
        pb = peers["paired_batch_10"]
        f["drain_vs_pgqueuer"] = _ratio(pb["claim_then_ack_vs_pgqueuer"])
        if "ack_and_claim_vs_pgqueuer" in pb:  # (the ack and the next claim as one statement: one run)
            f["ack_and_claim_vs_pgqueuer"] = _ratio(pb["ack_and_claim_vs_pgqueuer"])
    if "instructions" in out:
        f["instructions"] = out["instructions"]
    return f


def record(out: dict[str, Any], results: str, note: str, speed: str = "") -> dict[str, Any]:
    """A run's record: where its results are, its host, its figures and what it was for."""
    m = out["machine"]
    return {
        "date": out["started"],
        "commit": out.get("commit"),
        "results": results,
        "host": {
            "cpus": m["cpus"],
            "python": m["python"],
            "postgres": str(m["postgres"]).split(" ")[0],
            "commit_baseline_tx_s": {c: out["commit_baseline"][c] for c in ("1", "16")},
            "speed": speed,
        },
        **figures(out),
        "note": note,
    }


def load(path: Path | None = None) -> list[dict[str, Any]]:
    text = (path or HISTORY).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _median(r: Any) -> str:
    """A paired ratio's median; a single measurement's figure in brackets."""
    if r is None:
        return ""
    return f"{r['median']}" if isinstance(r, dict) else f"[{r}]"


def markdown(runs: list[dict[str, Any]]) -> str:
    """One row a run: the host's commit baseline, the enqueue every webhook ratio divides by, the
    paired medians (single measurements where a run had no paired rounds, in brackets), the drain
    beside PgQueuer's, the claim target's cold start, the instructions of a webhook, and its note."""
    head = (
        "| date | code | commit baseline, 16 | enqueue, one statement, 16 | created | existing | "
        "blend | claim + ack | drain / PgQueuer | cold start, claim | instructions, webhook | what it was |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in runs:
        p = r.get("paired", {}).get("vs_enqueue_one_statement", {})
        single = r["webhooks_single"].get("vs_enqueue_one_statement")
        created = _median(p.get("created")) or _median(single)
        claim_ack = _median(r.get("paired", {}).get("claim_ack_vs_drain")) or _median(r["claim_ack_vs_drain"])
        instr = r.get("instructions", {}).get("webhook")
        enqueue = r.get("paired", {}).get("enqueue_one_statement_16_per_s")
        if enqueue is None:
            one = r["enqueue_16_per_s"].get("one_statement")
            enqueue = "" if one is None else f"[{one:,}]"
        else:
            enqueue = f"{enqueue:,}"
        cells = [
            r["date"][:10],
            r["commit"] + (f" (bench {r['bench']})" if r.get("bench") else ""),
            f"{r['host']['commit_baseline_tx_s']['16']:,}",
            enqueue,
            created,
            _median(p.get("existing")),
            _median(p.get("blend")),
            claim_ack,
            _median(r["drain_vs_pgqueuer"]),
            f"{r['cold_start_ms']['claim']:,} ms",
            f"{instr:,}" if instr else "",
            r["note"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["add"] and len(argv) in (3, 4):
        path = Path(argv[1])
        new = record(json.loads(path.read_text()), f"bench/results/{path.name}", *argv[2:])
        runs = [new, *load()] if HISTORY.exists() else [new]
        HISTORY.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in runs), encoding="utf-8")
        return 0
    if argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(markdown(load()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
