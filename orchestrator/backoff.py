"""The service away: one line when it goes and one when it is back, and the waits between tries,
doubling with jitter up to 30 seconds (reset once it answers)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from orchestrator.client import Unreachable
from orchestrator.log import Log
from orchestrator.signals import Signals

T = TypeVar("T")


class Backoff:
    def __init__(self, log: Log, signals: Signals) -> None:
        self.log = log
        self.signals = signals
        self._away_since: float | None = None
        self._backoff = 0.5

    def insist(self, call: Callable[[], T]) -> T | None:
        """`call` until the service answers it, through network loss; None when SIGTERM came while
        the service was away (what was not said is said by the next run)."""
        while True:
            try:
                answer = call()
                self.came_back()
                return answer
            except Unreachable as exc:
                self.went_away(str(exc))
                if self.signals.stopping:
                    return None
                time.sleep(self.next())

    def next(self) -> float:
        """How long to wait before the next try."""
        delay = self._backoff * random.uniform(0.5, 1.5)
        self._backoff = min(self._backoff * 2, 30.0)
        return delay

    def went_away(self, why: str) -> None:
        if self._away_since is None:
            self._away_since = time.monotonic()
            self.log("away", f"service unreachable ({why}); retrying with backoff")

    def came_back(self) -> None:
        if self._away_since is not None:
            gone = time.monotonic() - self._away_since
            self._away_since = None
            self.log("back", f"service reachable again after {gone:.1f}s")
        self._backoff = 0.5
