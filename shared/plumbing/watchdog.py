"""Cuts a database connection whose deadline has passed, whatever the server does or does not say.

Why a cut, and why this one (psycopg 3's own means were tried first, against a link that takes
bytes and answers nothing: a frozen server, a saturated disk, a half-open connection):
- the server's `statement_timeout` is the server's own clock: a server that does not answer does
  not answer that either;
- `Connection.cancel()` / `cancel_safe(timeout=...)` send a cancel request to the same server over a
  new connection: a stalled server answers it no more than the query, and even a cancel that
  lands leaves the waiting thread waiting for the server's reply on the old socket;
- libpq's `keepalives*` and `tcp_user_timeout` end only a connection whose peer's kernel stops
  acknowledging: a frozen postmaster's kernel, or a proxy's, still does;
- `Connection.wait(timeout=...)` is not psycopg's public API (not in its documentation), and
  closing the connection from another thread (`close()`, PQfinish) frees libpq's state under the
  thread that is using it.
What works from outside, at once, and safely: `shutdown(SHUT_RDWR)` of the connection's socket.
The thread blocked in poll() wakes to an end of stream, libpq reports the connection lost, psycopg
raises OperationalError (the route answers 503), and the connection is BAD, so the pool throws it
away. The server, when it next looks, finds its client gone and rolls the transaction back.

One thread per process watches every connection lent with a deadline (`shared.plumbing.db.lend`), in a heap
ordered by deadline; it wakes for the earliest, at most every GRAIN seconds, so a busy process
costs it a few wake-ups a second, not one per request. Each watch holds a duplicate of the
socket's descriptor, closed when the watch ends: should libpq close its own descriptor meanwhile
(a connection lost for another reason) and the number be reused by a new connection, the cut
still reaches the socket it was meant for and no other.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

import psycopg

GRAIN = 0.05  # seconds: deadlines are kept to within this


class Watch:
    __slots__ = ("cut", "done", "fd", "until")

    def __init__(self, fd: int, until: float) -> None:
        self.fd = fd
        self.until = until
        self.done = False  # released by its owner, or cut
        self.cut = False


class Watchdog:
    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, conn: psycopg.Connection[Any], until: float) -> Watch:
        """Cut `conn`'s socket at `until` unless released first."""
        w = Watch(os.dup(conn.fileno()), until)
        with self._cond:
            heapq.heappush(self._heap, (until, next(self._seq), w))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="devpilot-db-watchdog", daemon=True)
                self._thread.start()
            elif self._heap[0][2] is w:  # earlier than what the thread sleeps towards
                self._cond.notify()
        return w

    def release(self, w: Watch) -> bool:
        """Stop watching; True when the connection was cut (it must not be used again)."""
        with self._cond:
            w.done = True
            cut = w.cut
        os.close(w.fd)
        return cut

    @contextmanager
    def watching(self, conn: psycopg.Connection[Any], until: float) -> Iterator[Watch]:
        w = self.watch(conn, until)
        try:
            yield w
        finally:
            self.release(w)

    def pending(self) -> int:
        """Watches not yet released or cut (tests, metrics)."""
        with self._cond:
            return sum(1 for _, _, w in self._heap if not w.done)

    def _run(self) -> None:
        heap = self._heap
        with self._cond:
            while True:
                now = monotonic()
                while heap and (heap[0][2].done or heap[0][0] <= now):
                    w = heapq.heappop(heap)[2]
                    if not w.done:
                        w.done = w.cut = True
                        _cut(w.fd)
                self._cond.wait(max(heap[0][0] - now, GRAIN) if heap else None)


def _cut(fd: int) -> None:
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # (already disconnected)
        pass
    finally:
        sock.detach()  # the descriptor stays the watch's, closed by its release


WATCHDOG = Watchdog()
# A forked worker (`devpilot serve`) starts with no watches and no thread of the parent's.
os.register_at_fork(after_in_child=WATCHDOG._reset)
