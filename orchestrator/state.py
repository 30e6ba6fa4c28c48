"""The orchestrator's state directory: where it is, that only its owner can enter it, and the login
kept there.

It holds issue texts, claim tokens and the machine's token, so every folder in it is 0700 and every
file 0600. `devpilot-orchestrator login` keeps the machine's token (with the service's URL, or a
cloud deploy's endpoints) in `login.json`, written whole or not at all; later runs take it from
there unless `--token`, DEVPILOT_ORCHESTRATOR_TOKEN or `--url` say otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

TOKEN_ENV = "DEVPILOT_ORCHESTRATOR_TOKEN"  # the variable's name, not its value  # nosec B105
CREDENTIALS = "login.json"


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "devpilot-orchestrator"


def private_dir(path: Path) -> Path:
    """A folder only this user can enter: the state holds issue texts and claim tokens."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)  # also when an older version made it with the default mode
    return path


def stored(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / CREDENTIALS).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("token"), str) else None


def store(state_dir: Path, data: dict[str, Any]) -> Path:
    """Owner-only, whole or not at all (a temporary file of mode 0600, then renamed over)."""
    folder = private_dir(state_dir)
    fd, name = tempfile.mkstemp(dir=folder, prefix=f".{CREDENTIALS}.")  # (mkstemp: mode 0600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(name, 0o600)
        os.replace(name, folder / CREDENTIALS)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise
    return folder / CREDENTIALS


def forget(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (state_dir / CREDENTIALS).unlink()
