"""CPU time by process, read from /proc: where a rate's time went on a machine whose cores the
bench's client, the server and Postgres share. Linux only (the bench's machines)."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def _stat_cpu_seconds(stat: str) -> float:
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def tree_seconds(pid: int) -> float:
    """User + system CPU of a process and its live children (the server's master and worker)."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    return sum(_stat_cpu_seconds(Path(f"/proc/{p}/stat").read_text()) for p in pids)


def self_seconds() -> float:
    """User + system CPU of this process, every thread."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def postgres_by_process() -> dict[int, float] | None:
    """User + system CPU of every process on this machine named `postgres` (the server, its
    backends and its background workers: all a statement costs, commit included), by pid; None
    when there is none to read (Postgres on another host)."""
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            found[int(entry.name)] = _stat_cpu_seconds((entry / "stat").read_text())
        except OSError:  # (it ended meanwhile)
            continue
    return found or None


def postgres_used(before: dict[int, float] | None, after: dict[int, float] | None) -> float | None:
    """Postgres's CPU seconds between two readings of `postgres_by_process`: each process alive at
    the second by how much it grew (from zero if it started meanwhile). A process that ended in
    between is left out, not subtracted: the backends of connections closed just before a run
    (the step before it) would otherwise take their whole lives' CPU off the figure. So read the
    second time before closing the run's own connections."""
    if before is None or after is None:
        return None
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def per_unit_ms(before: float | None, after: float | None, n: float) -> float | None:
    """CPU milliseconds per unit of work between two readings (None if either is missing)."""
    if before is None or after is None:
        return None
    return round((after - before) / max(n, 1) * 1000, 3)
