"""Process-wide state of a function instance: settings, the connection pool, the wake-up listener.

Nothing else survives between requests. Everything is made lazily on first use and shared by the
threads of the instance; a reclaimed instance loses nothing, because every request's effect is one
committed transaction or none.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from uuid import UUID

from shared.db import Pool, open_pool
from shared.embedded import Database, resolve
from shared.notices import SendResult, send_pending
from shared.settings import Settings, get_settings
from shared.wakeups import Wakeups


@dataclass
class Runtime:
    settings: Settings
    database: Database
    pool: Pool
    wakeups: Wakeups
    sender: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="devpilot-notices")
    )

    def send_soon(self, notice_ids: list[UUID]) -> Future[SendResult] | None:
        """After commit, off the request path: post these Linear notices now. If this instance dies
        first, they are still in the table and the sweep sends them."""
        if not notice_ids:
            return None

        def run() -> SendResult:
            try:
                return send_pending(self.pool, self.settings, ids=notice_ids)
            except Exception:
                logging.getLogger("devpilot.notices").exception("sending notices failed; the sweep retries")
                return SendResult(0, len(notice_ids))

        return self.sender.submit(run)


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
