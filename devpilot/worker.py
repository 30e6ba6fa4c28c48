"""The gunicorn worker `devpilot serve` runs: gunicorn's gthread worker, plus a deadline for reading
a request's headers.

gthread already keeps a client that sends nothing from taking a thread; one that trickles a byte at
a time still holds its thread while its headers are read, for as long as it likes. Here a watchdog
shuts down the socket of any request whose headers are not complete within HEADER_DEADLINE seconds:
the blocked read returns, gunicorn drops the connection, and the thread is free again. A long-poll is
not affected: its headers arrive at once; only its answer waits.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

HEADER_DEADLINE = 10.0


class DeadlineWorker(ThreadWorker):  # type: ignore[misc]  # gunicorn ships no type hints
    def init_process(self) -> None:
        self._reading: dict[Any, float] = {}
        self._reading_lock = threading.Lock()
        threading.Thread(target=self._watch, name="devpilot-header-deadline", daemon=True).start()
        super().init_process()

    def handle(self, conn: Any) -> Any:
        with self._reading_lock:
            self._reading[conn] = time.monotonic()
        try:
            return super().handle(conn)
        finally:
            with self._reading_lock:
                self._reading.pop(conn, None)

    def handle_request(self, req: Any, conn: Any) -> Any:
        with self._reading_lock:  # the headers are in: from here the request may take its time
            self._reading.pop(conn, None)
        return super().handle_request(req, conn)

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            with self._reading_lock:
                late = [c for c, since in self._reading.items() if now - since > HEADER_DEADLINE]
                for c in late:
                    del self._reading[c]
            for c in late:
                with contextlib.suppress(OSError):
                    c.sock.shutdown(socket.SHUT_RDWR)
