"""`devpilot status [--json]`: rich tables on a terminal, JSON otherwise (or with --json)."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from shared.status import Snapshot, format_age, pace_text


def render(snap: Snapshot, console: Console) -> None:
    t = snap.totals
    console.print(
        f"[bold]devpilot dispatch[/bold] — {snap.taken_at.isoformat(timespec='seconds')}   "
        + f"   queued {t.get('queued', 0)}   last 24 h: "
        + "   ".join(f"{k} {t.get(k, 0)}" for k in ("delivered", "failed", "cancelled"))
    )
    table = Table(title="orchestrators")
    for col in ("machine", "org", "Linear user", "queued", "claimed", "oldest due", "attempts", "last seen"):
        table.add_column(col, justify="right" if col in ("queued", "claimed", "attempts") else "left")
    for o in snap.orchestrators:
        table.add_row(
            o.name + ("" if o.active else " (revoked)"),
            o.org_id,
            o.linear_user_id,
            str(o.queued),
            str(o.claimed),
            format_age(o.oldest_due_s),
            str(o.attempts),
            o.last_seen_at.isoformat(timespec="seconds") if o.last_seen_at else "never",
        )
    console.print(table)
    failed = Table(title="recent failures")
    for col in ("issue", "reason", "when"):
        failed.add_column(col)
    for f in snap.failed:
        failed.add_row(
            f["issue_identifier"] or "",
            f["failure_reason"] or "",
            f["updated_at"].isoformat(timespec="seconds"),
        )
    console.print(failed)
    linear = Table(title="Linear connections")
    for col in ("org", "workspace", "kind", "state", "token expires", "rate limit"):
        linear.add_column(col)
    for c in snap.linear:
        linear.add_row(
            c["org_id"],
            c["workspace_name"] or "",
            c["kind"],
            "connected" if c["disconnected_at"] is None else f"DISCONNECTED: {c['disconnect_reason']}",
            c["expires_at"].isoformat(timespec="seconds") if c["expires_at"] else "never",
            pace_text(c),
        )
    console.print(linear)
    sw = snap.last_sweep
    console.print(
        f"last sweep: {sw['ran_at'].isoformat(timespec='seconds')} — requeued {sw['requeued']}, "
        f"dead-lettered {sw['dead_lettered']}"
        if sw
        else "last sweep: never"
    )


def show(snap: Snapshot, as_json: bool) -> None:
    if as_json or not sys.stdout.isatty():
        print(json.dumps(snap.to_json(), indent=2))
    else:
        render(snap, Console())
