"""The README's "Try it by hand" walkthrough, run as written (its own code blocks, pasted into a
fresh bash) against a live `devpilot serve`: what a new user does in their first ten minutes. Pasted
twice into the same checkout it must work twice: the database (the embedded one under ./.devpilot/,
here a test database) keeps the first run's machine, issue and delivery."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers.pg import Server
from tests.helpers.serving import free_port

ROOT = Path(__file__).parent.parent


def blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Try it by hand", 1)[1].split("\n## ", 1)[0]
    found: list[str] = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(found) >= 4
    return found


def walkthrough() -> str:
    return "\n".join(blocks())


def paste(script: str, port: int, database_url: str) -> subprocess.CompletedProcess[str]:
    """The blocks pasted into a fresh bash: none of our settings but the port and the database."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "XDG_RUNTIME_DIR")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({"PORT": str(port), "DATABASE_URL": database_url})
    return subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )


def answers(out: str) -> dict[str, Any]:
    """What the walkthrough printed: the webhook's answer, the claim, the ack, the machine list."""
    lines = [line for line in out.splitlines() if line.startswith("{")]
    found: dict[str, Any] = {}
    for line in lines:
        body = json.loads(line)
        if "logger" in body:  # the service's own log line, if it ever reaches stdout
            continue
        if "messages" in body:
            found["claim"] = body
        elif "orchestrators" in body:
            found["machines"] = body
        elif body.get("status") == "acked":
            found["ack"] = body
        elif "status" in body:
            found["webhook"] = body
    return found


def test_the_readme_walkthrough_works_pasted_twice_into_fresh_shells(pg_server: Server) -> None:
    name, url = pg_server.fresh_database()
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + walkthrough()
    port = free_port()  # the same port twice, as a second paste would use: the first run's service
    try:  # must be gone before the second starts
        runs = [paste(script, port, url), paste(script, port, url)]
    finally:
        pg_server.drop(name)
    seen: list[dict[str, Any]] = []
    for n, r in enumerate(runs, 1):
        assert r.returncode == 0, f"run {n}:\n{r.stdout}{r.stderr}"
        assert "machine token: dpo_" in r.stdout
        got = answers(r.stdout)
        webhook, claim = got["webhook"], got["claim"]
        assert webhook["status"] == "dispatched", f"run {n}: {webhook}"  # not "duplicate"
        [message] = claim["messages"]  # this run's issue, and only it, went to this run's machine
        assert message["issue"]["identifier"] == "ENG-1" and message["claimToken"]
        assert message["messageId"] == webhook["messageId"]
        assert message["orchestratorId"] == webhook["orchestratorId"]
        assert got["ack"] == {"status": "acked"}
        seen.append(message)
    first, second = seen
    assert first["issue"]["id"] != second["issue"]["id"]  # a new issue, not the first one again
    assert first["orchestratorId"] != second["orchestratorId"]
    listed = answers(runs[1].stdout)["machines"]["orchestrators"]
    mine = {m["orchestratorId"]: m for m in listed}
    assert set(mine) == {first["orchestratorId"], second["orchestratorId"]}
    assert all(m["lastSeenAt"] for m in mine.values())  # each machine's claim was seen


def test_the_walkthrough_pasted_while_another_service_holds_the_port_says_so_first(pg_server: Server) -> None:
    """Pasted while the first `./dev serve` still runs: its own service stops at once, naming the
    port, and the walkthrough stops waiting for it, instead of talking to the other one (which shared
    the port and answered half of the requests, under another admin token)."""
    import http.server
    import threading

    class Other(http.server.BaseHTTPRequestHandler):  # a service of another admin token
        def do_GET(self) -> None:
            self.send_response(401)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    name, url = pg_server.fresh_database()
    try:
        script = (
            "set -uo pipefail\n" + blocks()[0] + "\necho walkthrough-went-on"
        )  # (the block that starts it)
        r = paste(script, other.server_address[1], url)
    finally:
        other.shutdown()
        pg_server.drop(name)
    assert f"port {other.server_address[1]} on 127.0.0.1 is in use" in r.stderr
    assert r.stdout.strip().endswith("walkthrough-went-on")  # not waiting for ever
