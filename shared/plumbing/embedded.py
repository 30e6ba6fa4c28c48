"""Where the database is: DATABASE_URL, or an embedded Postgres (pgserver) under ./.devpilot/.

pgserver ships real Postgres binaries in a wheel and starts a private server on a Unix socket in
about a second, so `devpilot serve` and the tests work on a machine with nothing installed.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.plumbing.local_secrets import private_home
from shared.plumbing.settings import SettingsError


@dataclass
class Database:
    """The database the service uses: its URL, and whether it is the embedded one."""

    url: str
    embedded: bool
    handle: Any = None  # the pgserver.PostgresServer keeping the embedded server alive

    def describe(self) -> str:
        if self.embedded:
            return f"embedded Postgres at {self.url}"
        return redact(self.url)


def redact(url: str) -> str:
    """The URL without its password, for logs."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        parts = conninfo_to_dict(url)
    except Exception:
        return "<unparseable DATABASE_URL>"
    if "password" in parts:
        parts["password"] = "***"  # the mask that hides the password in logs  # nosec B105
    return make_conninfo("", **{k: str(v) for k, v in parts.items() if v is not None})


def start_embedded(data_dir: Path | None = None) -> Database:
    """Start (or join) the embedded Postgres whose data lives in `data_dir` (default ./.devpilot/pgdata)."""
    folder = data_dir or private_home() / "pgdata"
    # pgserver keeps its lock file in the user's runtime directory, which it asks platformdirs for
    # as it is imported. Without XDG_RUNTIME_DIR (root, containers, SSH) platformdirs warns, with a
    # source line, and falls back to /tmp/runtime-<uid>, which serves: that one warning is silenced,
    # for that import and the start only.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", _runtime_dir_warning())
        try:
            import pgserver
        except ImportError:
            raise SettingsError(
                "DATABASE_URL is not set and the embedded Postgres is not installed: set DATABASE_URL, "
                "or install the 'embedded' extra (pip install 'devpilot-dispatch[embedded]')"
            ) from None
        folder.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(folder.resolve(), cleanup_mode="stop")
    if data_dir is None and os.geteuid() == 0:
        # As root, pgserver runs Postgres as a user of its own and opens every folder above its
        # data to everyone (0755): ./.devpilot/ keeps only the passage that user needs.
        os.chmod(folder.parent, 0o711)  # noqa: S103  # nosec B103
    return Database(url=server.get_uri(), embedded=True, handle=server)


def _runtime_dir_warning() -> type[Warning]:
    """platformdirs' RuntimeDirWarning (a release without it says nothing of the kind: then a
    warning class nobody raises)."""
    try:
        import platformdirs
    except ImportError:
        return _NeverRaised
    found = getattr(platformdirs, "RuntimeDirWarning", _NeverRaised)
    return found if isinstance(found, type) and issubclass(found, Warning) else _NeverRaised


class _NeverRaised(Warning):
    pass


def resolve(database_url: str | None) -> Database:
    if database_url:
        return Database(url=database_url, embedded=False)
    return start_embedded()
