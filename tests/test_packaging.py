"""The package as a cloud build installs it: non-editable, from a wheel, used from another directory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import psycopg

from tests.helpers.pg import Server

ROOT = Path(__file__).parent.parent


def _installed(tmp_path: Path) -> Path:
    """A fresh virtualenv holding a non-editable install of the project's wheel. Its dependencies
    come from the test environment's site-packages, appended after its own (a path, not a site
    directory: the editable install's import hook there is not loaded)."""
    source = tmp_path / "source"  # the project's files only: no build/ left over from another build
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (source / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, source / f)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    [wheel] = wheels.glob("*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return venv


def test_non_editable_install_migrates_from_another_directory(pg_server: Server, tmp_path: Path) -> None:
    venv = _installed(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL")}
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import shared, infra; print(shared.__file__, infra.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(ROOT) not in where and str(venv) in where  # the installed copy, not this checkout

    name = "devpilot_pkg_" + os.urandom(4).hex()
    with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = pg_server.url_for(name)
        r = subprocess.run(
            [str(venv / "bin" / "devpilot"), "migrate"],
            cwd=elsewhere,
            env={**env, "DATABASE_URL": url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        shipped = sorted(p.stem for p in (ROOT / "infra" / "migrations").glob("*.sql"))
        assert f"applied {len(shipped)} migration(s)" in r.stdout, r.stdout
        with psycopg.connect(url) as conn:
            versions = [
                v for (v,) in conn.execute("SELECT version FROM devpilot_migrations ORDER BY version")
            ]
            tables = {
                t for (t,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
        assert versions == shipped
        assert {"dispatch_queue", "dispatch_sessions", "orchestrators", "linear_notices"} <= tables
    finally:
        pg_server.drop(name)


def test_non_editable_install_serves_a_request(pg_server: Server, tmp_path: Path) -> None:
    """`devpilot serve` from the installed package (Granian and all), from another directory."""
    import httpx

    venv = _installed(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    name, url = pg_server.fresh_database()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(venv / "bin" / "devpilot"), "serve", "--port", str(port), "--sweep-every", "0"],
        cwd=elsewhere,
        env={**env, "DATABASE_URL": url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        answer = None
        while time.monotonic() < deadline and answer is None:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
            except httpx.HTTPError:
                time.sleep(0.2)
        assert answer == {"ok": True}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        pg_server.drop(name)


def test_cloud_requirements_leave_out_the_embedded_postgres() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.lower().startswith("pgserver") for d in project["dependencies"])
    assert any(d.lower().startswith("pgserver") for d in project["optional-dependencies"]["embedded"])
    assert (ROOT / "requirements.txt").read_text().split("\n")[-2:] == [".", ""]  # the plain project
