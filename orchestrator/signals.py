"""What wakes the loop and what stops it.

A COMMAND's exit (SIGCHLD) and a realtime event (from its own thread) wake the loop: its next cycle
may start a conversation's next message, or claim. SIGTERM and SIGINT stop it: nothing new starts,
and a blocking wait is left at once (`Shutdown`), unless something must not be cut in half (an ack
in flight, a last word, housekeeping: `uninterrupted`), which SIGTERM waits for. Every wake-up
sets a lock-free pipe (`orchestrator.wakeup`), never a `threading.Event`: a handler runs on the
main thread between two bytecodes, maybe inside the Event's own code with its lock held, and would
wait for ever.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from orchestrator.wakeup import WakeupPipe


class Shutdown(Exception):
    """Raised out of a blocking wait when SIGTERM/SIGINT arrives and nothing is in flight."""


class Signals:
    def __init__(self) -> None:
        self.stopping = False  # SIGTERM or SIGINT came: nothing new starts
        self.closing = False  # the loop is done: a signal now only sets `stopping`
        self._critical = 0  # > 0 inside `uninterrupted` (an ack in flight, a last word): SIGTERM waits
        self._wake = WakeupPipe()

    def install(self) -> None:
        """Main thread only, once: the handlers, and every signal caught writes to the pipe."""
        self._wake.wake_on_signals()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        # A COMMAND that exits wakes the loop: its conversation's next message may start now.
        signal.signal(signal.SIGCHLD, lambda signum, frame: self._wake.set())

    @contextmanager
    def uninterrupted(self) -> Iterator[None]:
        """A block SIGTERM waits for: the handler sets `stopping` instead of raising, and the loop
        sees it afterwards."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = not self.stopping
        self.stopping = True
        self._wake.set()
        if first and self._critical == 0 and not self.closing:
            raise Shutdown()

    def wake(self) -> None:
        """Safe from any thread and from a signal handler."""
        self._wake.set()

    def wait(self, seconds: float) -> None:
        """Wait `seconds`, or until woken (a COMMAND exited, a realtime event, a signal), then
        forget the wake-up: the cycle about to run handles whatever woke it. (Never waiting without
        forgetting: one COMMAND's exit would leave it set, and every later wait, a backoff included,
        would return at once, in a loop that spins.)"""
        self._wake.wait(seconds)
        self._wake.clear()

    def pause(self, seconds: float) -> None:
        """Sleep `seconds`, cut short only by SIGTERM (`stopping`), in the middle of a cycle. (Not
        the wake-up: one set before, by the COMMAND whose exit is being reaped, would end every
        pause at once; and what it says is for the loop, which still sees it afterwards.)"""
        end = time.monotonic() + seconds
        while not self.stopping and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
