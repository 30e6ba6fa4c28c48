"""Process-wide state of a function instance: settings, the connection pool, the wake-up listener,
and the service layer over them.

Nothing else survives between requests. Everything is made lazily on first use and shared by the
threads of the instance; a reclaimed instance loses nothing, because every request's effect is one
committed transaction or none.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from shared.dispatch import (
    Database,
    Dispatch,
    Health,
    Pool,
    Settings,
    Wakeups,
    get_settings,
    open_pool,
    resolve,
)


@dataclass
class Runtime:
    """A function instance's state: what `get_runtime` builds on first use."""

    settings: Settings
    database: Database
    pool: Pool
    wakeups: Wakeups
    service: Dispatch = field(init=False)
    health: Health = field(init=False)  # /healthz's own connection, opened on first use

    def __post_init__(self) -> None:
        self.service = Dispatch(self.pool, self.settings, self.wakeups)
        s = self.settings
        self.health = Health(self.database.url, s.connect_timeout_seconds, s.healthz_deadline_seconds)


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                settings = get_settings()
                database = resolve(settings.database_url)
                # Not waited on: the request that builds the runtime (a cold instance's first)
                # waits for its connection within its deadline, and /healthz never waits for it.
                pool = open_pool(database.url, settings, wait=False)
                listen_url = settings.database_listen_url or database.url
                _runtime = Runtime(settings, database, pool, Wakeups(listen_url))
    return _runtime


def current() -> Runtime | None:
    """The runtime if this process has built one, without building it."""
    return _runtime


def install(runtime: Runtime | None) -> None:
    """Use an already-built runtime (devpilot serve, tests); None forgets it."""
    global _runtime
    with _lock:
        _runtime = runtime
