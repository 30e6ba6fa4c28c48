"""Granian's master process, safe against signals in quick succession.

Granian's master sleeps on a `threading.Event` and its SIGTERM/SIGINT handler sets that event. Python
runs a signal handler on the main thread between two bytecodes, so a second signal can arrive while
the first handler is inside `Event.set()`, holding the event's lock: the second handler then waits
for a lock its own thread holds, and the master hangs with its worker still serving (seen here about
once in 45 bursts of SIGTERMs; `tests/test_serve.py` makes that moment happen on purpose).

And a signal may not reach the master's main thread at all: the kernel may hand a process's signal
to any of its threads, and when signals come together (the main thread still has one pending) it
often picks the thread that waits for the worker to exit. Python runs the handler only when the
main thread next runs Python code, and a main thread asleep in a lock (or in select) without a
timeout never does: two SIGTERMs and a SIGINT sent at once hung it this way within a few tries.

`WakeupPipe` is the event without a lock: setting it writes a byte to a pipe (one system call, safe
in a signal handler and from any thread), waiting selects on the pipe. The pipe is also Python's
signal wake-up fd, so a signal caught on any thread wakes the main thread, which then runs the
handler; and the wait wakes every second regardless. `SignalSafeServer` is Granian's multi-process
server with its main-loop event replaced by one.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time

from granian.server.mp import MPServer


class WakeupPipe:
    """The part of `threading.Event` Granian's master uses (`set`, `clear`, `is_set`, `wait`), with no
    lock anywhere: re-entering `set` from a signal handler is harmless."""

    TICK = 1.0  # the longest a signal's handler waits for the main thread, whatever happens

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._flag = False

    def wake_on_signals(self) -> None:
        """Main thread only: every signal the process catches, on any thread, writes to the pipe.
        (The forked worker inherits this: its own signals wake the master for nothing, harmlessly.)"""
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        with contextlib.suppress(BlockingIOError):  # a full pipe has wake-ups enough; the flag is set
            os.write(self._write, b"!")

    def clear(self) -> None:
        self._flag = False
        self._drain()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._flag:
            left = self.TICK if deadline is None else min(self.TICK, deadline - time.monotonic())
            if left <= 0:
                break
            select.select([self._read], [], [], left)
            self._drain()  # a call: pending signal handlers run here, on the main thread
        return self._flag

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass


class SignalSafeServer(MPServer):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # Granian's own attribute: fail loudly at start if a release renames it, rather than keep
        # the hang silently.
        if not isinstance(self.main_loop_interrupt, threading.Event):
            raise RuntimeError(
                "granian's master no longer waits on main_loop_interrupt; see devpilot/master.py"
            )
        self.wakeup = WakeupPipe()
        self.main_loop_interrupt = self.wakeup  # type: ignore[assignment]

    def startup(self, *args: object, **kwargs: object) -> None:
        self.wakeup.wake_on_signals()
        super().startup(*args, **kwargs)  # type: ignore[no-untyped-call]
