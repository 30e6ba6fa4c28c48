"""How the loop waits between two drains, by `--transport`: `poll` waits its interval (±20 %) and is
fully correct on its own; `listen` waits in a long-poll of /claim; `realtime` waits for a Supabase
event (`orchestrator.realtime_wake`), with a poll every 30 seconds as a backstop, and polls at the
interval while the socket is away. Whatever ends a wait, the loop then claims until the queue is
empty: that is the reconnect sweep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from orchestrator.client import Api
from orchestrator.config import TransportName
from orchestrator.log import Log
from orchestrator.scheduler import Scheduler
from orchestrator.signals import Signals

LONG_POLL_SECONDS = 20
# A long-poll while a conversation's next message waits for its running COMMAND to exit: short,
# so the next COMMAND starts soon after (a long-poll cannot be woken by the exit, as a poll's wait is).
SHORT_POLL_SECONDS = 1
REALTIME_BACKSTOP_SECONDS = 30.0


@dataclass
class Transport:
    name: TransportName
    poll_interval: float
    api: Api
    log: Log
    signals: Signals
    _realtime: Any = field(default=None, init=False)  # the RealtimeWake, once started
    _realtime_said: bool = field(default=False, init=False)  # that it is away, said once until it is back

    def start(self) -> None:
        if self.name == "realtime":
            self._start_realtime()

    def stop(self) -> None:
        if self._realtime is not None:
            self._realtime.stop()

    def wait(self, scheduler: Scheduler) -> list[dict[str, Any]]:
        """Wait for the next drain. `listen` waits in a long-poll of /claim for as many messages as
        there is room for here, and returns what it claimed; the others return nothing. While an
        earlier run's COMMAND is watched (its exit sends no SIGCHLD), the loop looks again within
        SHORT_POLL_SECONDS; so does a long-poll while a message waits for its conversation's running
        COMMAND to exit."""
        if self.name == "listen":
            room = scheduler.room()
            if room > 0:
                short = scheduler.watching() or scheduler.waiting_behind()
                wait = SHORT_POLL_SECONDS if short else LONG_POLL_SECONDS
                return self.api.claim(min(room, 100), wait_seconds=wait)
            self.signals.wait(0.5)
        elif self.name == "realtime" and self._realtime is not None and self._realtime.connected.is_set():
            self.signals.wait(_watching(REALTIME_BACKSTOP_SECONDS, scheduler))
        else:
            self.signals.wait(_watching(self.poll_interval * random.uniform(0.8, 1.2), scheduler))
        return []

    def _start_realtime(self) -> None:
        try:
            from orchestrator.realtime_wake import RealtimeWake
        except ImportError:
            self.log("realtime", "realtime extra not installed; polling instead")
            return

        def on_state(state: str, detail: str) -> None:
            if state == "up":
                self._realtime_said = False
                self.log("realtime", "realtime connected: claiming on every insert")
            elif not self._realtime_said:
                self._realtime_said = True
                self.log(
                    "realtime", f"realtime unavailable ({detail}); polling every {self.poll_interval:g}s"
                )

        self._realtime = RealtimeWake(self.api, self.signals.wake, on_state)
        self._realtime.start()


def _watching(seconds: float, scheduler: Scheduler) -> float:
    return min(seconds, SHORT_POLL_SECONDS) if scheduler.watching() else seconds
