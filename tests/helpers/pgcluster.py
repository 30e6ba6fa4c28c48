"""A throwaway Postgres cluster of one test's own (initdb + pg_ctl from /usr/lib/postgresql/*/bin),
for what must never be done to the shared server other tests use: an immediate stop and a restart.

Its data directory and socket live in a temporary directory removed at the end; it listens on
127.0.0.1 on a free port. fsync is off (a stop of the server is what is tested, not of the
machine: committed WAL is in the kernel's hands either way); commits stay synchronous, so an
answered commit survives the immediate stop. As root (CI here), the server runs as `postgres`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.helpers.faultproxy import free_tcp_port


class Unavailable(RuntimeError):
    """No Postgres binaries here, or no user to run them as; the test skips with the reason."""


class Cluster:
    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
        if not found:
            raise Unavailable("no /usr/lib/postgresql/*/bin/initdb (Debian: apt-get install postgresql)")
        self.bin = Path(found[-1]).parent
        self.prefix: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="devpilot-pgcluster-"))
        if os.geteuid() == 0:  # Postgres refuses to run as root
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable("running as root and there is no postgres user") from None
            os.chown(self.dir, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data = self.dir / "data"
        self.port = free_tcp_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        r = subprocess.run(
            [*self.prefix, str(self.bin / tool), *args], capture_output=True, text=True, timeout=120
        )
        if r.returncode != 0:
            raise RuntimeError(f"{tool} failed: {r.stdout}{r.stderr}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")

    def stop_immediately(self) -> None:
        """As a crash: no checkpoint, every backend gone at once (recovery runs at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)
