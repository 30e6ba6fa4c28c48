"""Webhooks of one issue, or of one agent session, handled one at a time in the order they
arrived, within this process.

The database orders them by the issue's or the agent session's turn (an advisory lock held to the
commit). But the one-statement paths write through a group commit (`shared.plumbing.batching`), where a
webhook may wait in line for a batch without holding its turn; a later webhook of the same issue or
agent session (a stop, a follow-up, an unassignment) could then take the turn first: a stop
committed before the start it should cancel, a follow-up that finds no holder and becomes a second
start. So the intake takes a place in this line before anything else, and gives it up when its
webhook is answered: a later webhook of the same key waits for every earlier one to be written
or refused. (Across processes, webhooks that arrive together were never ordered beyond their turn:
Linear sends an agent session's events one after another, as the person acts.)

A place is waited for only until the request's database deadline (`shared.plumbing.deadline`): past it the
webhook is refused as the database's other waits are (`deadline.Passed`, answered 503, nothing
written) and Linear delivers it again.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from time import monotonic

from shared.plumbing import deadline


class InOrder:
    """`place(key)`: callers with the same key run their blocks one at a time, first come first
    served. A key of None runs at once."""

    def __init__(self, default_wait_seconds: float) -> None:
        self._default = default_wait_seconds
        self._lock = threading.Lock()
        self._lines: dict[Hashable, deque[object]] = {}

    @contextmanager
    def place(self, key: Hashable | None) -> Iterator[None]:
        if key is None:
            yield
            return
        # The first in line runs at once and needs nothing to wait on (most webhooks: nobody else
        # of their issue or agent session is in flight); each one behind it waits on an Event of
        # its own, set by the one ahead when it leaves.
        waits: threading.Event | None = None
        me: object
        with self._lock:
            line = self._lines.get(key)
            if line is None:
                me = object()
                self._lines[key] = line = deque((me,))
            else:
                me = waits = threading.Event()
                line.append(me)
        try:
            if waits is not None and not waits.wait(max(0.0, deadline.until(self._default) - monotonic())):
                raise deadline.Passed(
                    "an earlier webhook of the same issue or agent session is still being written"
                )
            yield
        finally:
            with self._lock:
                first = line[0] is me
                line.remove(me)
                if not line:
                    del self._lines[key]
                elif first:
                    nxt = line[0]
                    assert isinstance(nxt, threading.Event)  # (only the first in line has none)
                    nxt.set()

    def waiting(self, key: Hashable) -> int:
        """How many callers hold or wait for a place of `key` (for tests)."""
        with self._lock:
            return len(self._lines.get(key, ()))
