"""`/healthz`'s own connection: an answer within its deadline whatever the database does.

Never the pool's: a probe queued behind requests that wait on a stalled database would say nothing
until they gave up, and a load balancer gives a health check a second or two. One connection of
its own per process, pinged by one probe at a time (a probe that cannot have it within its
deadline says "unavailable"); each ping is cut by the watchdog at the probe's deadline, and the
connection is then thrown away and opened again off the probe's path: opening one may take longer
than a probe may wait (libpq's connect_timeout is two seconds at least), so a probe waits for the
opening only as long as its own deadline allows.
"""

from __future__ import annotations

import logging
import threading
from time import monotonic

import psycopg

from shared.plumbing.db import Conn, Connection
from shared.plumbing.sql import query
from shared.plumbing.watchdog import WATCHDOG

log = logging.getLogger("devpilot.health")


class Health:
    def __init__(self, url: str, connect_timeout: float, deadline_seconds: float) -> None:
        self._url = url
        self._connect_timeout = max(2, round(connect_timeout))
        self._deadline = deadline_seconds
        self._probe = threading.Lock()  # one probe at a time on the connection
        self._state = threading.Condition(threading.Lock())  # guards the two fields below
        self._conn: Conn | None = None
        self._opening = False

    def ok(self) -> bool:
        """Whether the database answered a ping within the deadline."""
        until = monotonic() + self._deadline
        if not self._probe.acquire(timeout=self._deadline):
            return False
        try:
            # Twice at most: a connection the server ended meanwhile (a restart, a terminated
            # backend) fails at once, and a new one may still answer within the deadline.
            for _ in range(2):
                conn = self._connection(until)
                if conn is None:
                    return False
                try:
                    with WATCHDOG.watching(conn, until) as watch:
                        conn.execute(query("ping"))
                except psycopg.Error:
                    self._discard(conn)
                    continue
                if watch.cut:  # answered just as the deadline passed: the connection is cut all the same
                    self._discard(conn)
                return True
            return False
        finally:
            self._probe.release()

    def start(self) -> None:
        """Open the connection now, off any probe's path (`devpilot serve` at start)."""
        with self._state:
            self._open_soon()

    def close(self) -> None:
        with self._state:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _connection(self, until: float) -> Conn | None:
        with self._state:
            if self._conn is None or self._conn.closed:
                self._conn = None
                self._open_soon()
                # (Until it is open, or the attempt failed: a refused connection says so at once.)
                self._state.wait_for(
                    lambda: self._conn is not None or not self._opening, timeout=max(0.0, until - monotonic())
                )
            return self._conn

    def _open_soon(self) -> None:
        # (called with the state lock held)
        if not self._opening:
            self._opening = True
            threading.Thread(target=self._open, name="devpilot-health-connect", daemon=True).start()

    def _open(self) -> None:
        conn: Conn | None = None
        try:
            # (No startup options and nothing prepared: the URL may be a transaction-mode pooler.)
            conn = Connection.connect(
                self._url, autocommit=True, connect_timeout=self._connect_timeout, prepare_threshold=None
            )
        except psycopg.Error as exc:
            log.debug("health connection not opened: %s", exc)
        finally:
            with self._state:
                self._opening = False
                if conn is not None:
                    self._conn = conn
                self._state.notify_all()

    def _discard(self, conn: Conn) -> None:
        with self._state:
            if self._conn is conn:
                self._conn = None
        conn.close()
