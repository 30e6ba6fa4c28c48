"""A wake-up a signal handler can set: `threading.Event`'s `set`/`clear`/`is_set`/`wait`, with no lock.

Python runs a signal handler on the main thread between two bytecodes, so it may run while that
thread is inside an Event's own code, holding the Event's lock (in `wait`, `clear` or `set`). A
handler that then calls `Event.set()` waits for a lock its own thread holds: the process hangs, and
every later signal's handler (the SIGTERM meant to stop it) hangs the same way. Both of our
long-running processes were seen doing this: Granian's master (`devpilot/master.py`) and the
orchestrator, whose SIGCHLD handler wakes its loop when a COMMAND exits.

`WakeupPipe` sets by writing a byte to a pipe (one system call, safe in a signal handler and from
any thread) and waits by selecting on it. It can also be Python's signal wake-up fd, so a signal
the kernel hands to another thread still wakes the main thread at once, which then runs the
handler; the wait also looks again every TICK regardless.

A `set` that races a `clear` may be lost, exactly as with an Event: a caller clears and then does
the work the wake-up asks for (claims), so nothing set before that work begins is missed.

It lives with the orchestrator, whose loop it wakes (`orchestrator.signals`), and imports nothing;
`devpilot serve`'s master uses it too (the orchestrator imports nothing of `shared/` but the wire).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time


class WakeupPipe:
    """The pipe lives as long as the process (a thread may still `set` it after its owner is done,
    and a closed descriptor's number could by then name another file). Both ends are
    non-inheritable (os.pipe's default), so no child process holds them."""

    TICK = 1.0  # the longest a signal's handler waits for the main thread, whatever happens

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._flag = False

    def wake_on_signals(self) -> None:
        """Main thread only: every signal the process catches, on any thread, writes to the pipe.
        (A forked child inherits this: its own signals wake the parent for nothing, harmlessly.)"""
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
