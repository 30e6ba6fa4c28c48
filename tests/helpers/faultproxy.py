"""A small TCP fault proxy of the tests' own between `devpilot serve` and Postgres (toxiproxy is the
model): it passes bytes, stalls them, resets connections, slows them, or cuts one exchange at an
exact point. An asyncio loop in a daemon thread; every control method is safe from any thread and
applies to the connections already open as well as to new ones.

- `stall()`: nothing is forwarded either way (each side's bytes are read and held, so the other end
  sees a peer that takes bytes and answers nothing: a frozen server, a saturated disk). New
  connections are accepted and held too. `passing()` releases what was held, in order, as a server
  that wakes up would read it; a client that hung up meanwhile has its bytes delivered first, then
  its end of the connection (so a COMMIT held in the stall still commits, as it would).
- `reset()`: every open connection is reset (RST both ways), and every new one while it lasts.
- `slow(seconds)`: every chunk waits `seconds` before it is forwarded, each direction in order.
- `cut_reply(marker, then)`: once, on the connection whose client sent `marker` last (and after
  it `then`, when given, before the client begins another transaction there): those bytes go to the server, and the server's next answer on that
  connection is dropped and the connection reset both ways. The server has done the work; the
  client never hears it (the link cut between COMMIT and its reply).
- `cut_before(marker)`: once, the client's bytes holding `marker` are dropped and the connection
  reset both ways: the server never sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo

Mode = Literal["pass", "stall", "reset", "slow"]
CHUNK = 65536


@dataclass
class Cut:
    marker: bytes
    then: bytes | None
    before: bool  # drop the client's bytes (True) or the server's answer to them (False)
    fired: threading.Event = field(default_factory=threading.Event)
    fired_at: float = 0.0
    # The connection that sent `marker` last: only its `then` counts. A request may send the
    # marker on one pooled connection (a one-statement try that wrote nothing) and then do the
    # work on another; the first connection's next COMMIT is someone else's.
    holder: object | None = None


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.tail = b""  # the client's last bytes, so a marker split across reads is still found
        self.cut_next_reply = False
        self.dead = False

    def reset(self) -> None:
        if self.dead:
            return
        self.dead = True
        self.proxy.resets += 1
        for w in (self.client, self.server):
            if w is None:
                continue
            sock = w.get_extra_info("socket")
            with contextlib.suppress(OSError):
                if sock is not None:  # SO_LINGER 0: close sends RST, not FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()

    def client_sent(self, chunk: bytes) -> Literal["forward", "drop"]:
        """Watch the client's bytes for the proxy's one-shot cut."""
        cut = self.proxy._cut
        if cut is None or cut.fired.is_set():
            return "forward"
        window = self.tail + chunk
        found = cut.marker in window
        if found:
            cut.holder = self
            window = window[window.rindex(cut.marker) + len(cut.marker) :]  # (not found again)
        if cut.holder is self and cut.then is not None and _begins_before(window, cut.then):
            # A transaction begun after the marker is another request's (the pool lent the
            # connection on once the marker's statement ended): its `then` is not the cut's.
            cut.holder = None
        self.tail = window[-64:]
        if cut.holder is not self or (not found if cut.then is None else cut.then not in window):
            return "forward"
        if cut.before:
            self.proxy._fire(cut)
            return "drop"
        self.cut_next_reply = True
        return "forward"


def _begins_before(window: bytes, then: bytes) -> bool:
    """`window` (the client's bytes since the marker) begins a transaction before any `then`."""
    begin = window.find(b"BEGIN")
    return begin >= 0 and (then not in window or begin < window.index(then))


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode: Mode = "pass"
        self.delay = 0.0
        self._cut: Cut | None = None
        self._links: set[_Link] = set()
        self.accepted = 0
        self.resets = 0  # connections reset (by `reset()`, a cut, or while in reset mode)
        self.open_now = 0
        self.open_max = 0
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Event | None = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(started,), name="faultproxy", daemon=True)
        self._thread.start()
        started.wait(10)
        self.port: int = self._port

    @classmethod
    def in_front_of(cls, db_url: str) -> FaultProxy:
        """A proxy to the server `db_url` names (its host and port); `url_for` reaches it."""
        target = conninfo_to_dict(db_url)
        return cls(str(target.get("host") or "127.0.0.1"), int(target.get("port") or 5432))

    # --- control, from any thread -----------------------------------------------------------
    def url_for(self, db_url: str) -> str:
        """The same database, through the proxy."""
        return make_conninfo(db_url, host="127.0.0.1", port=str(self.port))

    def passing(self) -> None:
        self._set("pass")

    def stall(self) -> None:
        self._set("stall")

    def reset(self) -> None:
        self._set("reset")

    def slow(self, seconds: float) -> None:
        self.delay = seconds
        self._set("slow")

    def cut_reply(self, marker: bytes, then: bytes | None = None) -> Cut:
        return self._arm(Cut(marker, then, before=False))

    def cut_before(self, marker: bytes, then: bytes | None = None) -> Cut:
        return self._arm(Cut(marker, then, before=True))

    def reset_open_max(self) -> None:
        self.open_max = self.open_now

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for link in list(self._links):
                link.reset()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # --- inside the loop ----------------------------------------------------------------------
    def _arm(self, cut: Cut) -> Cut:
        def arm() -> None:
            self._cut = cut

        self._call(arm)
        return cut

    def _fire(self, cut: Cut) -> None:
        cut.fired_at = time.monotonic()
        cut.fired.set()

    def _set(self, mode: Mode) -> None:
        def change() -> None:
            self.mode = mode
            if mode == "reset":
                for link in list(self._links):
                    link.reset()
            assert self._changed is not None
            self._changed.set()  # wake every held chunk to look again
            self._changed = asyncio.Event()

        self._call(change)

    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._changed = asyncio.Event()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self._port = int(self._server.sockets[0].getsockname()[1])
        started.set()
        self._loop.run_forever()

    async def _gate(self) -> None:
        """Until the link may carry a chunk: held while stalled, delayed while slow."""
        while self.mode == "stall":
            assert self._changed is not None
            await self._changed.wait()
        if self.mode == "slow" and self.delay > 0:
            await asyncio.sleep(self.delay)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, writer)
        self.accepted += 1
        self.open_now += 1
        self.open_max = max(self.open_max, self.open_now)
        self._links.add(link)
        try:
            if self.mode == "reset":
                link.reset()
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:  # the server is down: the client sees its connection refused
                link.reset()
                return
            link.server = up_writer
            if link.dead:  # reset while connecting
                link.reset()
                return
            await asyncio.gather(
                self._client_to_server(link, reader, up_writer),
                self._server_to_client(link, up_reader, writer),
            )
        finally:
            self._links.discard(link)
            self.open_now -= 1
            for w in (writer, link.server):
                if w is not None:
                    w.close()

    async def _client_to_server(
        self, link: _Link, reader: asyncio.StreamReader, up: asyncio.StreamWriter
    ) -> None:
        try:
            while not link.dead:
                chunk = await reader.read(CHUNK)
                await self._gate()
                if link.dead:
                    return
                if not chunk:  # the client hung up: the server reads what it sent, then the end
                    with contextlib.suppress(OSError):
                        up.write_eof()
                    return
                if link.client_sent(chunk) == "drop":
                    link.reset()
                    return
                up.write(chunk)
                await up.drain()
        except (OSError, asyncio.IncompleteReadError):
            link.reset()

    async def _server_to_client(
        self, link: _Link, reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        client_gone = False
        try:
            while not link.dead:
                chunk = await reader.read(CHUNK)
                if not chunk:
                    if not client_gone:
                        with contextlib.suppress(OSError):
                            client.write_eof()
                    link.dead = True
                    return
                await self._gate()
                if link.dead:
                    return
                if link.cut_next_reply and self._cut is not None and not self._cut.fired.is_set():
                    self._fire(self._cut)
                    link.reset()
                    return
                if client_gone:
                    continue  # a kernel would drop these; the server ends when it reads the client's end
                try:
                    client.write(chunk)
                    await client.drain()
                except OSError:
                    client_gone = True
        except OSError:
            link.reset()


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
