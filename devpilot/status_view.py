"""`devpilot status [--json]`: rich tables on a terminal, JSON otherwise (or with --json).

The tables fit an 80-column terminal with every machine's name and every time whole (times as ages,
"4m 05s ago", and dates to the minute); the ids (org, Linear user) and what each machine has are
columns of their own when the terminal is wide enough to show them whole (always in --json).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from shared.operators.status import Snapshot, format_age, pace_text


def _age(at: datetime | None, now: datetime) -> str:
    return "never" if at is None else f"{format_age(max(0.0, (now - at).total_seconds()))} ago"


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M") if at is not None else "never"


def _table(title: str) -> Table:
    # No vertical rules, and two spaces between columns: the room goes to the values.
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )


def _fitting(console: Console, make: Callable[[bool], Table]) -> tuple[Table, bool]:
    """The table with its wide columns when it fits the console whole, else without them."""
    wide = make(True)
    unbounded = console.options.update_width(10_000)  # (a measurement is capped at the width it is given)
    if Measurement.get(console, unbounded, wide).maximum <= console.width:
        return wide, True
    return make(False), False


def _machines(snap: Snapshot, wide: bool) -> Table:
    table = _table("orchestrators")
    table.add_column("machine", no_wrap=True)
    if wide:
        table.add_column("org", no_wrap=True)
        table.add_column("Linear user", no_wrap=True)
    for col in ("queued", "claimed"):
        table.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    table.add_column("waiting", no_wrap=True, min_width=7)  # the oldest due row's age
    table.add_column("attempts", justify="right", no_wrap=True, min_width=8)
    table.add_column("last seen", no_wrap=True)
    if wide:
        table.add_column("has", no_wrap=True)
    for o in snap.orchestrators:
        has = ", ".join([*o.repositories, *(f"label {label}" for label in o.labels)])
        table.add_row(
            o.name + ("" if o.active else " (revoked)"),
            *([o.org_id, o.linear_user_id] if wide else []),
            str(o.queued),
            str(o.claimed),
            format_age(o.oldest_due_s),
            str(o.attempts),
            _age(o.last_seen_at, snap.taken_at),
            *([has] if wide else []),
        )
    return table


def _connections(snap: Snapshot, wide: bool) -> Table:
    table = _table("Linear connections")
    if wide:
        table.add_column("org", no_wrap=True)
    table.add_column("workspace", overflow="fold")
    table.add_column("kind", no_wrap=True)
    table.add_column("state", overflow="fold")
    table.add_column("token expires", no_wrap=True)
    table.add_column("rate limit", overflow="fold")
    for c in snap.linear:
        table.add_row(
            *([c["org_id"]] if wide else []),
            c["workspace_name"] or ("" if wide else c["org_id"]),
            c["kind"],
            "connected" if c["disconnected_at"] is None else f"DISCONNECTED: {c['disconnect_reason']}",
            _when(c["expires_at"]),
            pace_text(c),
        )
    return table


def render(snap: Snapshot, console: Console) -> None:
    t, now = snap.totals, snap.taken_at
    console.print(f"[bold]devpilot dispatch[/bold] — {now.strftime('%Y-%m-%d %H:%M:%S %Z').strip()}")
    console.print(
        f"queued {t.get('queued', 0)}   last 24 h: "
        + "   ".join(f"{k} {t.get(k, 0)}" for k in ("delivered", "failed", "cancelled"))
    )
    machines, wide = _fitting(console, lambda wide: _machines(snap, wide))
    console.print(machines)
    if not wide and snap.orchestrators:
        console.print("(each machine's org, Linear user and repositories: a wider terminal, or --json)")
    failed = _table("recent failures")
    failed.add_column("issue", no_wrap=True)
    failed.add_column("reason", overflow="fold")
    failed.add_column("when", no_wrap=True)
    for f in snap.failed:
        failed.add_row(f["issue_identifier"] or "", f["failure_reason"] or "", _when(f["updated_at"]))
    console.print(failed)
    console.print(_fitting(console, lambda wide: _connections(snap, wide))[0])
    sw = snap.last_sweep
    console.print(
        f"last sweep: {_when(sw['ran_at'])} ({_age(sw['ran_at'], now)}) — requeued {sw['requeued']}, "
        f"dead-lettered {sw['dead_lettered']}"
        if sw
        else "last sweep: never"
    )


def show(snap: Snapshot, as_json: bool) -> None:
    if as_json or not sys.stdout.isatty():
        print(json.dumps(snap.to_json(), indent=2))
    else:
        render(snap, Console())  # (as wide as the terminal; COLUMNS when set)
