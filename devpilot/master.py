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

`WakeupPipe` (`orchestrator/wakeup.py`) is the event without a lock, and also the signal wake-up
fd, so a signal caught on any thread wakes the main thread, which then runs the handler; the wait
wakes every second regardless. `SignalSafeServer` is Granian's multi-process server with its main-loop event
replaced by one.

And one listening socket, bound by the caller, shared by every worker. On Linux Granian has each
worker bind its own socket with SO_REUSEPORT, which the kernel lets any process of the same user
join: a second `devpilot serve` on a port in use then started without a word and took about half
of the connections. A socket bound once without SO_REUSEPORT (what Granian does on the other
platforms) refuses the second serve at its bind, and the workers of one serve share it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading

from granian.net import SocketHolder  # type: ignore[attr-defined]  # (granian's own import of it)
from granian.server.mp import MPServer

from orchestrator.wakeup import WakeupPipe


class SignalSafeServer(MPServer):
    def __init__(self, *args: object, listener: socket.socket | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.listener = listener  # bound and listening (`listen`), or None: Granian binds its own
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

    def _init_shared_socket(self) -> None:
        """The workers' socket: the caller's, as Granian hands its own to the workers where it binds
        once (its attributes, as its non-Linux path sets them; the workers are forked and inherit
        the descriptor; Granian closes it at shutdown)."""
        if self.listener is None:
            super()._init_shared_socket()  # type: ignore[no-untyped-call]
            return
        fd = self.listener.fileno()
        self._ssp = None
        self._shd = SocketHolder(fd, False, self.backlog)  # type: ignore[call-arg,assignment]
        self._sfd = fd  # type: ignore[assignment]
        self.listener.set_inheritable(True)
        self._sso = self.listener


def listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on (host, port) without SO_REUSEPORT (port 0: one the system picks);
    OSError (EADDRINUSE) when something listens there already. SO_REUSEADDR, as every server sets
    it: a port whose last connections are still closing (TIME_WAIT) is free to serve again."""
    family = socket.AF_INET
    with contextlib.suppress(ValueError):  # (a host name is bound as IPv4, as Granian would)
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=backlog, reuse_port=False)
