"""A stand-in for Supabase Realtime: a small local Phoenix-channel websocket server.

It speaks just enough of the protocol (vsn 1.0.0 JSON frames) for the realtime transport's test:
it answers `phx_join` and heartbeats, records every join's topic and payload (config and
access_token), and can push a `postgres_changes` INSERT to the joined topics. It is not Supabase:
no database is behind it; the test decides when an "insert" happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed


class PhoenixStandIn:
    def __init__(self) -> None:
        self.joins: list[dict[str, Any]] = []
        self.access_tokens: list[str] = []
        self._conns: set[tuple[ServerConnection, str]] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with serve(self._handle, "127.0.0.1", 0) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    async def _handle(self, ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):  # a client that goes away is no error here
            await self._serve(ws)

    async def _serve(self, ws: ServerConnection) -> None:
        async for raw in ws:
            msg = json.loads(raw)
            event, topic, ref = msg.get("event"), msg.get("topic"), msg.get("ref")
            if event == "phx_join":
                self.joins.append(
                    {
                        "topic": topic,
                        "payload": msg.get("payload"),
                        "path": ws.request.path if ws.request else "",
                    }
                )
                changes = msg["payload"]["config"].get("postgres_changes", [])
                reply = {"postgres_changes": [{"id": i + 1, **c} for i, c in enumerate(changes)]}
                self._conns.add((ws, topic))
                await ws.send(
                    json.dumps(
                        {
                            "event": "phx_reply",
                            "topic": topic,
                            "ref": ref,
                            "payload": {"status": "ok", "response": reply},
                        }
                    )
                )
            elif event == "access_token":
                self.access_tokens.append(msg["payload"]["access_token"])
            elif event == "heartbeat" or ref is not None:
                await ws.send(
                    json.dumps(
                        {
                            "event": "phx_reply",
                            "topic": topic,
                            "ref": ref,
                            "payload": {"status": "ok", "response": {}},
                        }
                    )
                )

    def push_insert(self, record: dict[str, Any]) -> int:
        """Send an INSERT change to every joined topic; returns how many sockets got it."""

        async def send() -> int:
            n = 0
            for ws, topic in list(self._conns):
                payload = {
                    "ids": [1],
                    "data": {
                        "schema": "public",
                        "table": "dispatch_queue",
                        "commit_timestamp": "2026-12-02T10:00:00Z",
                        "type": "INSERT",
                        "errors": None,
                        "columns": [],
                        "record": record,
                    },
                }
                try:
                    await ws.send(
                        json.dumps(
                            {"event": "postgres_changes", "topic": topic, "ref": None, "payload": payload}
                        )
                    )
                    n += 1
                except Exception:
                    self._conns.discard((ws, topic))
            return n

        return asyncio.run_coroutine_threadsafe(send(), self._loop).result(10)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)
