"""What an idle fleet costs: every machine waiting for work, none arriving.

Generated from the figures a bench run measured (server CPU per empty claim, its wall time, the
database time of one empty claim) and the platforms' published list prices, for three ways of
waiting. It is a model: each assumption is written next to the number it makes.

List prices (USD, on-demand, before free tiers, read on 2026-12-03):
- Cloud Run, Tier 1 regions, CPU allocated only during requests (the default):
  $0.000024 per vCPU-second, $0.0000025 per GiB-second, $0.40 per million requests; billed instance
  time is rounded up to 100 ms. https://cloud.google.com/run/pricing
- AWS Lambda, x86, first 6 billion GB-seconds a month: $0.0000166667 per GB-second (billed in 1 ms
  steps), $0.20 per million requests; a Function URL adds nothing.
  https://aws.amazon.com/lambda/pricing/
- Log ingestion: Cloud Logging $0.50 per GiB (https://cloud.google.com/stackdriver/pricing);
  CloudWatch Logs, Lambda's logs, $0.50 per GB for the first 10 TB a month
  (https://aws.amazon.com/cloudwatch/pricing/). Both are taken as $0.50 per GiB here.
Free tiers (Cloud Run 180k vCPU-s, 360k GiB-s and 2 M requests a month; Lambda 1 M requests and
400k GB-s; Cloud Logging 50 GiB a month) are left out: at these volumes they are a rounding error,
and the table compares modes.

    python -m bench.cost [bench/results/latest.json]

prints the tables again from a run's figures (the prices or the model changed, not the code measured).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from functions.logs import Fields, StructuredFormatter

MONTH_S = 30.44 * 86_400

CLOUD_RUN = {"vcpu_s": 0.000024, "gib_s": 0.0000025, "per_million": 0.40}
LAMBDA = {"gb_s": 0.0000166667, "per_million": 0.20}
LOG_USD_PER_GIB = 0.50

# The deployment as deploy.sh makes it: Cloud Run defaults (1 vCPU, 512 MiB, 80 concurrent requests
# per instance, autoscaling towards 60 % CPU); Lambda 512 MB (infra/aws_lambda.py).
RUN_VCPU, RUN_GIB, RUN_CONCURRENCY, RUN_TARGET_CPU = 1.0, 0.5, 80, 0.6
LAMBDA_GB = 0.5

# How each mode waits (the reference orchestrator's constants, and the service's own):
POLL_S = 5.0  # --transport poll --poll-interval 5
LONG_POLL_S = 25.0  # one long-poll open per machine, answered empty after this long
RECHECK_S = 5.0  # a waiting long-poll looks at the table this often (shared/dispatch.py)
REALTIME_BACKSTOP_S = 30.0  # realtime: a claim this often while the socket is up (orchestrator)
REALTIME_TOKEN_S = 540.0  # and a new Realtime token this often (600 s tokens, renewed 60 s early)


@dataclass(frozen=True)
class Measured:
    cpu_ms: float  # server CPU per empty claim (devpilot serve)
    wall_ms: float  # wall time of one empty claim, as a client sees it
    db_us: float  # database time of one empty claim


def _cloud_run_busy(requests_per_s: float, cpu_s_per_s: float, held: float) -> tuple[float, float]:
    """(instances, billed instance-seconds a month). Billed while an instance has a request in
    flight, in 100 ms steps: with requests arriving at rate r, a step holds one with probability
    1 - e^(-r/10). Long-polls (`held` open at all times) keep their instances busy all month."""
    by_cpu = math.ceil(cpu_s_per_s / (RUN_VCPU * RUN_TARGET_CPU)) if cpu_s_per_s else 0
    by_held = math.ceil(held / RUN_CONCURRENCY)
    instances = max(1, by_cpu, by_held)
    if held:
        return instances, instances * MONTH_S
    per_instance = requests_per_s / instances
    return instances, instances * MONTH_S * (1 - math.exp(-per_instance * 0.1))


def row(machines: int, mode: str, m: Measured) -> dict[str, Any]:
    if mode == "poll 5 s":
        per_s = machines / POLL_S
        held, lambda_s, db_queries_per_s = 0.0, m.wall_ms / 1000, per_s
    elif mode == "long-poll 25 s":
        per_s = machines / LONG_POLL_S
        # Each open long-poll is billed on Lambda for its whole wait; it marks its machine as
        # listening once, and re-checks the table (a claim and a revoked check) every RECHECK_S
        # while it waits.
        held, lambda_s = float(machines), LONG_POLL_S
        db_queries_per_s = machines * (1 / LONG_POLL_S + 2 / RECHECK_S)
    elif mode == "realtime":
        per_s = machines * (1 / REALTIME_BACKSTOP_S + 1 / REALTIME_TOKEN_S)
        held, lambda_s, db_queries_per_s = 0.0, m.wall_ms / 1000, per_s
    else:
        raise ValueError(mode)
    requests = per_s * MONTH_S
    cpu_s = requests * m.cpu_ms / 1000
    instances, busy_s = _cloud_run_busy(per_s, per_s * m.cpu_ms / 1000, held)
    cloud_run = (
        busy_s * (RUN_VCPU * CLOUD_RUN["vcpu_s"] + RUN_GIB * CLOUD_RUN["gib_s"])
        + requests / 1e6 * CLOUD_RUN["per_million"]
    )
    billed_lambda_s = max(0.001, math.ceil(lambda_s * 1000) / 1000)
    aws = requests * billed_lambda_s * LAMBDA_GB * LAMBDA["gb_s"] + requests / 1e6 * LAMBDA["per_million"]
    return {
        "machines": machines,
        "mode": mode,
        "requests_per_month": round(requests),
        "function_cpu_s": round(cpu_s),
        "db_s": round(db_queries_per_s * MONTH_S * m.db_us / 1e6),
        "cloud_run_instances": instances,
        "cloud_run_usd": round(cloud_run, 2),
        "lambda_usd": round(aws, 2),
    }


def table(m: Measured) -> list[dict[str, Any]]:
    return [row(n, mode, m) for n in (1_000, 10_000) for mode in ("poll 5 s", "long-poll 25 s", "realtime")]


def _by_fleet(intro: str, columns: dict[str, str], rows: list[dict[str, Any]]) -> str:
    """A table with a row per fleet size and way of waiting: `columns` maps each further column's
    title to the format of its cell (the row's fields by name)."""
    head = (
        " | ".join(["| machines | waiting by", *columns]) + " |\n|---:|---|" + "---:|" * len(columns) + "\n"
    )
    lines = [" | ".join(["| {machines:,} | {mode}", *columns.values()]).format(**r) + " |" for r in rows]
    return intro + "\n\n" + head + "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]], m: Measured) -> str:
    intro = (
        f"Measured: {m.cpu_ms} ms server CPU and {m.wall_ms} ms wall per empty claim, "
        f"{m.db_us:.0f} µs database time."
    )
    columns = {
        "requests / month": "{requests_per_month:,}",
        "function CPU-s / month": "{function_cpu_s:,}",
        "database s / month": "{db_s:,}",
        "Cloud Run instances busy": "{cloud_run_instances:,}",
        "Cloud Run $ / month": "{cloud_run_usd:,.2f}",
        "Lambda $ / month": "{lambda_usd:,.2f}",
    }
    return _by_fleet(intro, columns, rows)


def request_line_bytes() -> int:
    """One empty poll's request line as the service writes it (JSON, newline included), made by the
    service's own formatter: what each logged poll adds to the log bill, before the platform's
    metadata around it."""
    fields = Fields(route="claim", method="POST", status=200, ms=1.23, orchestratorId=str(uuid.uuid4()))
    record = logging.LogRecord("devpilot.request", logging.INFO, __file__, 0, "%s", (fields,), None)
    return len(StructuredFormatter(as_json=True).format(record).encode()) + 1


def log_rows(rows: list[dict[str, Any]], line_bytes: int) -> list[dict[str, Any]]:
    """Our own request lines a month for each row of the table: by default an empty poll is a debug
    line (not written), so only the realtime mode's token renewals are logged; with
    DEVPILOT_LOG_EMPTY_POLLS=1 every request is."""
    out = []
    for r in rows:
        every = r["requests_per_month"]
        default = r["machines"] / REALTIME_TOKEN_S * MONTH_S if r["mode"] == "realtime" else 0.0
        gib = every * line_bytes / 2**30
        out.append(
            {
                "machines": r["machines"],
                "mode": r["mode"],
                "lines_default": round(default),
                "usd_default": round(default * line_bytes / 2**30 * LOG_USD_PER_GIB, 2),
                "lines_every_poll": every,
                "gib_every_poll": round(gib, 1),
                "usd_every_poll": round(gib * LOG_USD_PER_GIB, 2),
            }
        )
    return out


def logs_markdown(rows: list[dict[str, Any]], line_bytes: int) -> str:
    intro = (
        f"Our request lines ({line_bytes} bytes each, before the platform's metadata), at "
        f"${LOG_USD_PER_GIB:.2f} per GiB:"
    )
    columns = {
        "lines / month (default)": "{lines_default:,}",
        "$ / month (default)": "{usd_default:,.2f}",
        "lines / month (DEVPILOT_LOG_EMPTY_POLLS=1)": "{lines_every_poll:,}",
        "GiB / month": "{gib_every_poll:,}",
        "$ / month": "{usd_every_poll:,.2f}",
    }
    return _by_fleet(intro, columns, log_rows(rows, line_bytes))


def report(m: Measured) -> str:
    """The idle-fleet tables as bench/results/idle-fleet-cost.md holds them."""
    rows = table(m)
    return markdown(rows, m) + "\n" + logs_markdown(rows, request_line_bytes())


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else Path(__file__).parent / "results" / "latest.json")
    run = json.loads(path.read_text())
    m = Measured(
        cpu_ms=run["server_cpu_ms"]["empty_claim"],
        wall_ms=run["server_cpu_ms"]["empty_claim_wall_ms"],
        db_us=round(run["idle"]["force_generic_plan"]),
    )
    print(report(m), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
