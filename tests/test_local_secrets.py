"""`./dev serve` on a developer's machine (the embedded database) can do something at once: an admin
token and a webhook secret that are unset are generated on the first start, kept under ./.devpilot/
(0600) and used again afterwards; serve says where they are and how to read them, never their
values. With DATABASE_URL set it guesses nothing (tests/test_serve.py: "NOT SET")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from shared.linear.webhooks import sign
from tests.helpers.api import issue_event

ROOT = Path(__file__).parent.parent
UNSET = (
    "DATABASE_URL",
    "TEST_DATABASE_URL",
    "DEVPILOT_ADMIN_TOKEN",
    "LINEAR_WEBHOOK_SECRET",
    "DEVPILOT_HOME",
)


# ./.devpilot/: 0700; as root 0711, as the embedded Postgres then runs as a user of its own (pgserver's)
PRIVATE = 0o711 if os.geteuid() == 0 else 0o700


def start(cwd: Path) -> tuple[subprocess.Popen[str], list[str]]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    proc = subprocess.Popen(
        [sys.executable, "-m", "devpilot", "serve", "--port", "0", "--sweep-every", "0"],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=(cwd / "serve.err").open("a"),
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (lines and lines[-1].startswith("sweep:")):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
    return proc, lines


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return out


def test_serve_on_the_embedded_database_generates_the_admin_token_and_webhook_secret(tmp_path: Path) -> None:
    proc, lines = start(tmp_path)
    try:
        said = "\n".join(lines)
        token_file, secret_file = (
            (tmp_path / ".devpilot" / "admin-token"),
            (tmp_path / ".devpilot" / "webhook-secret"),
        )
        assert (
            f"admin token (DEVPILOT_ADMIN_TOKEN): generated on this first start, kept in {token_file} "
            f"(mode 0600; read it with: cat {token_file})" in said
        ), said
        assert (
            f"webhook secret (LINEAR_WEBHOOK_SECRET): generated on this first start, kept in {secret_file}"
            in said
        )
        for f in (token_file, secret_file):
            assert f.stat().st_mode & 0o777 == 0o600
        # ./.devpilot/ is the user's alone (root's embedded Postgres, a user of its own, may pass through)
        assert (tmp_path / ".devpilot").stat().st_mode & 0o777 == PRIVATE
        token, secret = token_file.read_text().strip(), secret_file.read_text().strip()
        assert len(token) >= 32 and len(secret) >= 32 and token != secret
        url = lines[0].split()[-1]
        assert (
            httpx.get(f"{url}/orchestrators", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        )
        body = json.dumps(issue_event(assignee="nobody")).encode()
        r = httpx.post(f"{url}/webhook", content=body, headers={"Linear-Signature": sign(secret, body)})
        assert r.status_code == 200 and r.json()["status"] == "ignored"
        out = said + stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    logged = (tmp_path / "serve.err").read_text()
    assert token not in out + logged and secret not in out + logged
    # the next start keeps them (and takes back a folder an older version left open to all)
    (tmp_path / ".devpilot").chmod(0o755)
    proc, lines = start(tmp_path)
    try:
        said = "\n".join(lines)
        assert f"admin token (DEVPILOT_ADMIN_TOKEN): from an earlier start, kept in {token_file}" in said
        assert token_file.read_text().strip() == token and secret_file.read_text().strip() == secret
        assert (tmp_path / ".devpilot").stat().st_mode & 0o777 == PRIVATE
        url = lines[0].split()[-1]
        assert (
            httpx.get(f"{url}/orchestrators", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        )
        stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_folder_of_the_secrets_is_its_owners_alone(tmp_path: Path, monkeypatch: Any) -> None:
    from shared.plumbing import local_secrets

    monkeypatch.setenv("DEVPILOT_HOME", str(tmp_path / "home"))
    local_secrets.read_or_create("a-secret", lambda: b"x")
    assert (tmp_path / "home").stat().st_mode & 0o777 == 0o700
    (tmp_path / "home").chmod(0o755)  # as an older version made it
    local_secrets.read_or_create("a-secret", lambda: b"y")
    assert (tmp_path / "home").stat().st_mode & 0o777 == PRIVATE
