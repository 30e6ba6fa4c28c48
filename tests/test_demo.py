"""`devpilot demo` runs the whole loop on an embedded database and cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_demo_shows_the_timeline(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TEST_DATABASE_URL")}
    r = subprocess.run(
        [sys.executable, "-m", "devpilot", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        env={**env, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "webhook 'issue assigned' -> 200 dispatched" in out
    assert "webhook 'agent session' -> 200 dispatched" in out
    timeline = [line for line in out.splitlines() if "agent started after" in line]
    assert len(timeline) == 2
    assert "[agent] working on DEMO-1" in out and "[agent] working on DEMO-2" in out
    assert "started DEMO-1" in r.stderr and "acked DEMO-2" in r.stderr
    home = out.split("embedded Postgres in ")[1].split()[0]
    assert not Path(home).exists()
