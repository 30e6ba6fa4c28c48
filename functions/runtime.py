"""Process-wide state of a function instance: settings, the connection pool, the wake-up listener.

Nothing else survives between requests. Everything is made lazily on first use and shared by the
threads of the instance; a reclaimed instance loses nothing, because every request's effect is one
committed transaction or none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from shared.db import Pool, open_pool
from shared.embedded import Database, resolve
from shared.settings import Settings, get_settings
from shared.wakeups import Wakeups


@dataclass
class Runtime:
    settings: Settings
    database: Database
    pool: Pool
    wakeups: Wakeups


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                settings = get_settings()
                database = resolve(settings.database_url)
                pool = open_pool(database.url, settings)
                listen_url = settings.database_listen_url or database.url
                _runtime = Runtime(settings, database, pool, Wakeups(listen_url))
    return _runtime


def install(runtime: Runtime | None) -> None:
    """Use an already-built runtime (devpilot serve, tests); None forgets it."""
    global _runtime
    with _lock:
        _runtime = runtime


def reset() -> None:
    global _runtime
    with _lock:
        if _runtime is not None:
            _runtime.wakeups.stop()
            _runtime.pool.close()
        _runtime = None
