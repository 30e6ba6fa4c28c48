"""The cold-start bench's own spawns (bench/coldstart.py): the framework's floor answers through
functions-framework with nothing of this project loaded, and a timed spawn leaves no process of its
group running into the next one (gunicorn's worker outlived its killed master by about two seconds,
shutting down inside the spawns timed after it)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from bench import coldstart, table
from tests.helpers.fresh_python import run_json


def _group(pgid: int) -> list[int]:
    """The live (not yet exited) processes of process group `pgid`."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            alive.append(int(entry.name))
    return alive


def test_a_timed_spawn_leaves_nothing_of_its_group_running(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = popen(*args, **kwargs)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(subprocess, "Popen", recording)
    assert coldstart.floor_ms(db_url) > 0
    [master] = spawned
    # (a SIGKILLed process is gone at once; 0.3 s is slack for the kernel, far below the worker's
    # own look at its parent)
    until = time.monotonic() + 0.3
    while _group(master.pid) and time.monotonic() < until:
        time.sleep(0.01)
    assert _group(master.pid) == []


def test_the_floor_loads_nothing_of_this_project() -> None:
    code = "import sys, json, bench.cold_floor; print(json.dumps(sorted(sys.modules)))"
    loaded = run_json(code, env={**os.environ, "PYTHONPATH": str(coldstart.ROOT)})
    assert {"psycopg", "psycopg_pool", "flask"} <= set(loaded)
    assert not [m for m in loaded if m.split(".")[0] in {"shared", "functions", "devpilot", "orchestrator"}]


def test_the_table_gives_each_target_against_the_floor_too() -> None:
    cold = {
        "claim": {"vs_bare_import": 1.3, "vs_framework_floor": 1.1},
        "ack": {"vs_bare_import": 1.31, "vs_framework_floor": 1.12},
        "bare_import": {"median_ms": 400},
        "framework_floor": {"median_ms": 470, "vs_bare_import": 1.18},
    }
    said = table._vs_bare_import(cold, ["claim", "ack"])
    assert said == "1.3 / 1.31× the bare import (400 ms); 1.1 / 1.12× the framework's floor (470 ms, 1.18×)"
    del cold["framework_floor"]
    assert table._vs_bare_import(cold, ["claim", "ack"]) == "1.3 / 1.31× the bare import (400 ms)"
