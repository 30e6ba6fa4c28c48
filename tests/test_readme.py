"""The README's "Try it by hand" walkthrough, run as written (its own code blocks, pasted into a
fresh bash) against a live `devpilot serve`: what a new user does in their first ten minutes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.helpers.pg import Server
from tests.helpers.serving import free_port

ROOT = Path(__file__).parent.parent


def walkthrough() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Try it by hand", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 4
    return "\n".join(blocks)


def test_the_readme_walkthrough_works_pasted_into_a_fresh_shell(pg_server: Server) -> None:
    name, url = pg_server.fresh_database()
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "XDG_RUNTIME_DIR")
    env = {k: v for k, v in os.environ.items() if k in keep}  # a fresh shell: none of our settings
    env.update({"PORT": str(free_port()), "DATABASE_URL": url})
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + walkthrough()
    try:
        r = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
        )
    finally:
        pg_server.drop(name)
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "machine token: dpo_" in out
    assert '"status":"dispatched"' in out
    assert '"identifier":"ENG-1"' in out and '"claimToken"' in out
    assert '{"status":"acked"}' in out
    assert '"lastSeenAt":"' in out  # the machine's claim was seen
