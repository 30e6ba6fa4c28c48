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

`WakeupPipe` (`shared/wakeup.py`) is the event without a lock, and also the signal wake-up fd, so a
signal caught on any thread wakes the main thread, which then runs the handler; the wait wakes every
second regardless. `SignalSafeServer` is Granian's multi-process server with its main-loop event
replaced by one.
"""

from __future__ import annotations

import threading

from granian.server.mp import MPServer

from shared.wakeup import WakeupPipe


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
