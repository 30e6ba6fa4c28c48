"""The README's performance table, from a run's results: `python -m bench.table [latest.json]`.

Prints markdown to paste into README.md's "Performance" section: one row per kind of webhook and
their blend (each kind's rate over HTTP and its paired ratio to the library's enqueue as one
statement), claim + ack over HTTP and against PgQueuer, issue starts beside `bench.floor`'s bare
server (each ratio the median of its own rounds' ratios), and the cold starts. A run of
`python -m bench.bench --only paired` (no peers, no cold starts) gives the rows it has.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.loadgen import BLEND, KINDS

RESULTS = Path(__file__).resolve().parent / "results"

# What each kind of webhook is, as the table says it.
LABELS: dict[str, str] = {
    "created": "issue created with an assignee",
    "existing": "existing issue assigned (nothing earlier to cancel)",
    "reassigned": "issue re-assigned (one machine's work cancelled, a start for another's)",
    "unassigned": "issue unassigned (its machine's work cancelled)",
    "agent_created": "agent session `created`",
    "prompted": "agent session `prompted` (a follow-up for the machine that holds it)",
    "stop": "agent session stopped (its queued work cancelled, a `stop` for the machine that has it)",
    "edit": "issue edited, assignee unchanged (recorded, nothing else)",
}


def blend_label() -> str:
    parts = ", ".join(f"{w} {k.replace('_', ' ')}" for k, w in BLEND.items())
    return f"blend, per 100 webhooks: {parts}"


def ratio(summary: dict[str, Any]) -> str:
    """A paired ratio: its median and range."""
    return f"{summary['median']}× ({summary['min']}–{summary['max']})"


def kind_rows(paired: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(measure, result, ratio) for each kind of webhook and the blend, from a run's `paired`."""
    rows = []
    if "kinds" not in paired and "webhooks_vs_library_enqueue_one_statement" in paired:
        # A run from before the kinds (bench of 7c80c6d and earlier): its webhooks were `created`.
        one = paired["webhooks_vs_library_enqueue_one_statement"]
        rate = sorted(h for _, h in one["pairs"])[len(one["pairs"]) // 2]
        return [(LABELS["created"], f"{rate:,}/s", ratio(one))]
    for kind in (*KINDS, "blend"):
        k = paired.get("kinds", {}).get(kind)
        if k is None:
            continue
        label = blend_label() if kind == "blend" else LABELS[kind]
        rows.append((label, f"{k['rate']:,}/s, p50 {k['p50_ms']} ms", ratio(k["vs_enqueue_one_statement"])))
    return rows


def rows(out: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The table's rows for what the run `out` measured."""
    p = out.get("paired", {})
    clients = p.get("clients", 16)
    result: list[tuple[str, str, str]] = []
    if p:
        one = [lib for lib, _ in p["webhooks_vs_library_enqueue_one_statement"]["pairs"]]
        result.append(
            (
                f"the library's enqueue as one statement, {clients} clients (what each ratio divides by)",
                f"{sorted(one)[len(one) // 2]:,} msg/s (median of rounds)",
                "1×",
            )
        )
        result += kind_rows(p)
        cycles = [h for _, h in p["claim_ack_vs_library_drain"]["pairs"]]
        result.append(
            (
                f"claim + ack cycles over HTTP, {clients} threads (ratio: to the library's drain by "
                f"{clients} claimers at batch 1)",
                f"{sorted(cycles)[len(cycles) // 2]:,}/s",
                ratio(p["claim_ack_vs_library_drain"]),
            )
        )
    if "floor" in out:  # (runs before 2026-12-08 have none)
        f = out["floor"]
        rate = f["median_rate"]
        result.append(
            (
                "issue created, `devpilot serve` / the bare server of `bench.floor`: the same statement "
                f"and nothing else ({len(f['rounds'])} rounds of its own, the library {rate['library']:,}/s; "
                f"the bare server {f['vs_library']['floor']}× the library)",
                f"{rate['devpilot serve']:,} / {rate['floor']:,}/s",
                f"{f['vs_library']['devpilot serve']}×; {f['vs_floor']['devpilot serve']}× the bare server",
            )
        )
    if "paired_batch_10" in out.get("peers", {}):
        pb = out["peers"]["paired_batch_10"]
        for key, label in (
            ("ack_and_claim_vs_pgqueuer", "`ack_and_claim` (ack + next claim, one statement)"),
            ("claim_then_ack_vs_pgqueuer", "`claim`, then `ack_many`"),
        ):
            if key not in pb:  # (`ack_and_claim` was measured in one run only, 2026-12-06)
                continue
            ours = sorted(h for _, h in pb[key]["pairs"])
            theirs = sorted(lib for lib, _ in pb[key]["pairs"])
            result.append(
                (
                    f"library drain, 1 claimer, batch 10: {label} / PgQueuer's drain, batch 10 "
                    f"({pb['rounds']} paired rounds)",
                    f"{ours[len(ours) // 2]:,} / {theirs[len(theirs) // 2]:,} msg/s",
                    ratio(pb[key]) + " PgQueuer",
                )
            )
    elif "peers" in out and "drain" in out:
        result.append(
            (
                "claim + batch ack, 1 claimer, batch 10 / PgQueuer's drain, batch 10",
                f"{out['drain'].get('1x10', 0):,} / {out['peers']['pgqueuer']['drain_per_s']:,} msg/s",
                f"{out['peers']['ratio_vs_pgqueuer']}× PgQueuer",
            )
        )
    if "cold_start" in out:
        targets = [t for t in ("claim", "ack", "webhook", "healthz") if t in out["cold_start"]]
        result.append(
            (
                "cold start, spawn → first answer: " + " / ".join(targets),
                " / ".join(str(out["cold_start"][t]["median_ms"]) for t in targets)
                + f" ms (max {max(out['cold_start'][t]['max_ms'] for t in targets)} ms)",
                _vs_bare_import(out["cold_start"], targets),
            )
        )
    return result


def _vs_bare_import(cold: dict[str, Any], targets: list[str]) -> str:
    """Each target against the bare import of what it needs, spawned in the same run (runs before
    the baseline was measured have none)."""
    bare = cold.get("bare_import")
    if bare is None:
        return ""
    ratios = " / ".join(str(cold[t]["vs_bare_import"]) for t in targets)
    said = f"{ratios}× the bare import ({bare['median_ms']} ms)"
    floor = cold.get("framework_floor")  # (runs before 2026-12-07, evening, have none)
    if floor is None:
        return said
    to_floor = " / ".join(str(cold[t]["vs_framework_floor"]) for t in targets)
    return f"{said}; {to_floor}× the framework's floor ({floor['median_ms']} ms, {floor['vs_bare_import']}×)"


def markdown(out: dict[str, Any], name: str = "latest.json") -> str:
    """The table, with the line above it that says which run it is (`name`: its results file)."""
    m = out.get("machine", {})
    p = out.get("paired", {})
    postgres = str(m.get("postgres", "?")).split(" ")[0]
    head = (
        f"Last run of `bench/run` ({out.get('started', '?')[:10]}, the code of {out.get('commit') or '?'}; "
        f"{m.get('cpus', '?')} cores, Python {m.get('python', '?')}, PostgreSQL {postgres} "
        f"on the same machine; `bench/results/{name}`). Webhooks: {p.get('clients', 16)} senders "
        f"on `devpilot serve`, each kind for {p.get('kind_seconds', '?')} s in each of {p.get('rounds', '?')} "
        "paired rounds, beside the library's enqueue measured in the same round:"
    )
    lines = [head, "", "| measure | result | × the library |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows(out)]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else RESULTS / "latest.json"
    print(markdown(json.loads(path.read_text()), path.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
