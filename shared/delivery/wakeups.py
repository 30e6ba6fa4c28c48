"""LISTEN/NOTIFY wake-ups for long-polling claims: one listening connection per process.

A notification is only a hint ("look now"): its payload names the orchestrator, and a woken
request still claims from the table. Many inserts in a burst set one event, so they cost one claim.
The listener uses DATABASE_LISTEN_URL, a direct or session-mode connection, because a
transaction-mode pooler drops LISTEN. If it is down, long-polls still re-check the table every few
seconds, so a lost notification costs latency, never a message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from shared.plumbing.db import Connection
from shared.plumbing.sql import query
from shared.plumbing.watchdog import WATCHDOG

log = logging.getLogger("devpilot.wakeups")
CHECK_EVERY = 10.0  # seconds between the listening connection's pings
CHECK_DEADLINE = 5.0  # a ping (or the LISTEN) not answered by then: the connection is cut, and opened again


class Wakeups:
    def __init__(self, listen_url: str) -> None:
        self._url = listen_url
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = defaultdict(set)
        self._listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="devpilot-listen", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait_until_listening(self, timeout: float) -> bool:
        self.start()
        return self._listening.wait(timeout)

    @contextmanager
    def waiter(self, orchestrator_id: str) -> Iterator[threading.Event]:
        """Register before checking the table, so a NOTIFY between the check and the wait is kept."""
        self.start()
        event = threading.Event()
        with self._lock:
            self._waiters[orchestrator_id].add(event)
        try:
            yield event
        finally:
            with self._lock:
                waiters = self._waiters.get(orchestrator_id)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[orchestrator_id]

    def _wake(self, orchestrator_id: str) -> None:
        with self._lock:
            for event in self._waiters.get(orchestrator_id, ()):
                event.set()

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()

    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                with Connection.connect(self._url, autocommit=True, connect_timeout=5) as conn:
                    with WATCHDOG.watching(conn, time.monotonic() + CHECK_DEADLINE):
                        conn.execute(query("listen"))
                    self._listening.set()
                    # Anything committed while we were not listening: let every waiter re-check.
                    self._wake_all()
                    delay = 0.5
                    checked = time.monotonic()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            self._wake(note.payload)
                        if time.monotonic() - checked >= CHECK_EVERY:
                            # A listener only reads: a link that went silent (a stalled server, a
                            # half-open connection after a failover) would look like a quiet one
                            # for ever. A ping within a deadline tells them apart.
                            with WATCHDOG.watching(conn, time.monotonic() + CHECK_DEADLINE):
                                conn.execute(query("ping"))
                            checked = time.monotonic()
            except psycopg.Error as exc:
                if self._stop.is_set():  # stopping: the connection going away is expected
                    return
                if self._listening.is_set():
                    log.warning("listen connection lost (%s); long-polls fall back to re-checking", exc)
                self._listening.clear()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
