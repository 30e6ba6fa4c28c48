"""Secrets a developer's machine keeps under ./.devpilot/ (DEVPILOT_HOME): each generated once, on
first need, in a file of mode 0600, and read from it afterwards. Only with the embedded database
(a developer's machine): with DATABASE_URL set, a missing secret stays missing and `serve` says so,
rather than guessing one for a deployment.

- `encryption.key`: the Fernet key for stored Linear credentials (shared.plumbing.crypto);
- `admin-token`, `webhook-secret`: DEVPILOT_ADMIN_TOKEN and LINEAR_WEBHOOK_SECRET for `devpilot
  serve` when they are unset, so that a first `./dev serve` can do something. Their values are never
  printed or logged: `serve` prints where they are and how to read them.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from shared.plumbing.settings import Settings


def home() -> Path:
    return Path(os.environ.get("DEVPILOT_HOME", ".devpilot"))


def private_home() -> Path:
    """`home()`, made if missing, and its owner's alone (mode 0700, also when an older version made
    it 0755): the secrets and the embedded database are in it. Root's embedded Postgres runs as a
    user of its own, which must pass through it to its data: for root, it may keep others' `x`
    (0711, shared.plumbing.embedded), never their `r` or `w`."""
    path = home()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    keep = info.st_mode & 0o011 if os.geteuid() == 0 else 0
    if info.st_uid == os.geteuid() and info.st_mode & 0o777 != 0o700 | keep:
        path.chmod(0o700 | keep)
    return path


def read_or_create(name: str, make: Callable[[], bytes]) -> tuple[bytes, bool]:
    """The secret in `home()/name`, made by `make` and written whole (mode 0600) if there is none
    yet; and whether this call made it. Several processes or threads at once keep the first one."""
    path = private_home() / name
    created = False
    if not path.exists():
        # A temporary file of its own for each caller (mkstemp: mode 0600), linked into place: whole
        # or not at all, and a second caller racing here finds the first one's file and keeps it.
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        tmp = Path(tmp_name)
        with os.fdopen(fd, "wb") as f:
            f.write(make())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            created = True
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_bytes().strip(), created


class Kept(NamedTuple):
    """A setting `serve` took from a file under ./.devpilot/ (the report names the file, never the value)."""

    variable: str
    path: Path
    created: bool


GENERATED = (
    ("admin_token", "DEVPILOT_ADMIN_TOKEN", "admin-token"),
    ("linear_webhook_secret", "LINEAR_WEBHOOK_SECRET", "webhook-secret"),
)


def fill(settings: Settings) -> tuple[Settings, list[Kept]]:
    """For `serve` on the embedded database: the admin token and the webhook secret, each from the
    environment when set, else from (or generated into) its file under ./.devpilot/."""
    values: dict[str, str] = {}
    kept: list[Kept] = []
    for field, variable, name in GENERATED:
        if getattr(settings, field):
            continue
        value, created = read_or_create(name, lambda: secrets.token_urlsafe(32).encode())
        values[field] = value.decode()
        kept.append(Kept(variable, (home() / name).resolve(), created))
    return (settings.replace(**values) if values else settings), kept
