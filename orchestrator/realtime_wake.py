"""The realtime transport's wake-up source: a Supabase Realtime subscription to this
orchestrator's inserts into dispatch_queue. An event only says "claim now"; the work always comes
from /claim. Runs the async `realtime` client on its own thread and event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.client import Api

REFRESH_MARGIN = 60.0  # seconds before expiry to fetch a new token (a quarter of a shorter token's life)


def _refresh_at(expires: float, now: float) -> float:
    """When to ask for the next token: REFRESH_MARGIN before expiry, or with a quarter of its life
    left for a token shorter than that (else a 30 s token would be renewed on every tick)."""
    return expires - min(REFRESH_MARGIN, max(0.0, expires - now) / 4)


class RealtimeWake:
    def __init__(self, api: Api, on_event: Callable[[], None], on_state: Callable[[str, str], None]) -> None:
        self._api = api
        self._on_event = on_event
        self._on_state = on_state  # ("up" | "down" | "disabled", detail)
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="realtime", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                grant = self._api.realtime_token()
            except Exception as exc:
                self._on_state("down", f"realtime token unavailable: {exc}")
                self._stop.wait(delay)
                delay = min(delay * 2, 60.0)
                continue
            if grant is None:
                self._on_state("disabled", "realtime_disabled")
                return
            try:
                asyncio.run(self._session(grant))
                delay = 1.0
            except Exception as exc:
                self.connected.clear()
                self._on_state("down", f"realtime socket: {type(exc).__name__}: {exc}")
                self._stop.wait(delay)
                delay = min(delay * 2, 60.0)

    async def _session(self, grant: dict[str, Any]) -> None:
        from realtime import AsyncRealtimeClient, RealtimePostgresChangesListenEvent

        client = AsyncRealtimeClient(
            grant["supabaseUrl"].rstrip("/") + "/realtime/v1",
            grant.get("anonKey") or grant["token"],
            auto_reconnect=False,
            max_retries=1,
        )
        await client.connect()
        await client.set_auth(grant["token"])
        joined = asyncio.Event()
        failed: list[str] = []

        def on_subscribe(state: Any, err: Exception | None) -> None:
            name = getattr(state, "value", str(state))
            if name == "SUBSCRIBED":
                joined.set()
            elif name in ("CHANNEL_ERROR", "TIMED_OUT", "CLOSED"):
                failed.append(f"{name}: {err}")
                joined.set()

        channel = client.channel(f"devpilot:{grant['filter']}")
        channel.on_postgres_changes(
            RealtimePostgresChangesListenEvent.Insert,
            schema="public",
            table=grant["table"],
            filter=grant["filter"],
            callback=lambda _payload: self._on_event(),
        )
        await channel.subscribe(on_subscribe)
        await asyncio.wait_for(joined.wait(), timeout=15)
        if failed:
            await client.close()
            raise ConnectionError(failed[0])
        self.connected.set()
        self._on_state("up", "realtime subscribed")
        self._on_event()  # anything inserted before we subscribed
        renew = _refresh_at(_expiry(grant), time.time())
        try:
            while not self._stop.is_set():
                await asyncio.sleep(0.5)
                if not client.is_connected:
                    raise ConnectionError("socket closed")
                if time.time() >= renew:
                    fresh = await asyncio.to_thread(self._api.realtime_token)
                    grant = fresh or grant
                    await client.set_auth(grant["token"])
                    renew = _refresh_at(_expiry(grant), time.time())
        finally:
            self.connected.clear()
            await client.close()


def _expiry(grant: dict[str, Any]) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(grant["expiresAt"]).timestamp()
    except (KeyError, ValueError):
        return time.time() + 300
