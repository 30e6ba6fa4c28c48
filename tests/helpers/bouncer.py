"""A real PgBouncer in transaction mode in front of the test server, as Supabase's functions reach
Postgres (its pooler on port 6543). Used when DEVPILOT_TEST_POOLER=pgbouncer: the app's pool then
goes through it (DEVPILOT_TRANSACTION_POOLER=1), while LISTEN keeps a direct connection."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class Unavailable(RuntimeError):
    """PgBouncer cannot run here; the message says why (the tests that need it skip with it)."""


class Bouncer:
    def __init__(self, server_url: str) -> None:
        binary = shutil.which("pgbouncer") or (
            "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
        )
        if binary is None:
            raise Unavailable("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        target = conninfo_to_dict(server_url)
        host, port = str(target.get("host") or ""), str(target.get("port") or "5432")
        if not host or host.startswith("/"):
            raise Unavailable(
                f"the test server is not reachable over TCP ({host or 'socket'}); PgBouncer needs one"
            )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.dir = Path(tempfile.mkdtemp(prefix="devpilot-pgbouncer-"))
        user = str(target.get("user") or "postgres")
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/users.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 40
ignore_startup_parameters = extra_float_digits,options
"""
        )
        os.chmod(self.dir, 0o755)
        args = [binary, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            args[1:1] = ["-u", "postgres"]
        self.log = self.dir / "pgbouncer.log"  # opened here, so it does not matter whom it runs as
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        self.server_url = server_url
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(
                    f"pgbouncer exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise Unavailable("pgbouncer did not start listening")

    def url_for(self, direct_url: str) -> str:
        """The same database, through PgBouncer."""
        return make_conninfo(direct_url, host="127.0.0.1", port=str(self.port))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


POOLER = os.environ.get("DEVPILOT_TEST_POOLER") == "pgbouncer"
_shared: list[Bouncer] = []


def shared(server_url: str) -> Bouncer:
    """One PgBouncer for the whole run (stopped when the test session ends)."""
    if not _shared:
        _shared.append(Bouncer(server_url))
    return _shared[0]


def app_env(db_url: str) -> dict[str, str]:
    """The database settings the app runs with: direct, or (DEVPILOT_TEST_POOLER=pgbouncer) through
    PgBouncer in transaction mode, with LISTEN on the direct connection."""
    if not POOLER:
        return {"DATABASE_URL": db_url}
    return {
        "DATABASE_URL": shared(db_url).url_for(db_url),
        "DATABASE_LISTEN_URL": db_url,
        "DEVPILOT_TRANSACTION_POOLER": "1",
    }
