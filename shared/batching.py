"""Group commit for concurrent requests: the items that arrive while one batch is being written are
written together in the next one.

One caller at a time leads: it takes the waiting items (its own first) and runs them as a batch; the
others wait. When its batch is done, it wakes their callers with their results and hands the lead
to the first caller still waiting, if any, so no caller leads for ever. A caller alone writes its
item at once (a batch of one): nothing waits for company. A batch that fails is retried item by
item, each by its own caller, so one bad item fails only its own request. Batches are written one at
a time, and the items that arrive meanwhile make the next one: the busier, the larger.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("alone", "done", "item", "lead", "result")

    def __init__(self, item: T, waits: bool) -> None:
        self.item = item
        # Only a caller that waits needs something to wait on; one that leads at once (every
        # caller alone) is spared making it.
        self.done = threading.Event() if waits else None
        self.lead = False  # woken to lead the next batch
        self.alone = False  # its batch failed: the caller writes it alone
        self.result: R | None = None


class Combiner(Generic[T, R]):
    """`submit(item)` answers `one(item)`'s result, written in a batch (`many(items)`, a result
    per item, in order) with the items of concurrent callers, at most `most` at a time."""

    def __init__(self, many: Callable[[list[T]], list[R]], one: Callable[[T], R], most: int) -> None:
        self._many = many
        self._one = one
        self._most = most
        self._lock = threading.Lock()
        self._waiting: list[_Slot[T, R]] = []
        self._busy = False  # a caller leads

    def submit(self, item: T) -> R:
        with self._lock:
            lead = not self._busy
            slot: _Slot[T, R] = _Slot(item, waits=not lead)
            self._waiting.append(slot)
            self._busy = True
        if slot.done is not None:
            slot.done.wait()
            if not slot.lead:
                return self._one(item) if slot.alone else slot.result  # type: ignore[return-value]
        # Leading: this slot is first in line (the line was empty, or it was handed the lead as
        # its first), so it is in the batch taken now.
        with self._lock:
            batch, self._waiting = self._waiting[: self._most], self._waiting[self._most :]
        results: list[R] | None = None
        failed: Exception | None = None
        try:
            items = [s.item for s in batch]
            results = [self._one(item)] if len(items) == 1 else self._many(items)
        except Exception as exc:
            failed = exc
            for s in batch:
                s.alone = True
        else:
            for s, r in zip(batch, results, strict=True):
                s.result = r
        finally:
            with self._lock:
                heir = self._waiting[0] if self._waiting else None
                if heir is None:
                    self._busy = False
            for s in batch[1:]:
                s.done.set()  # type: ignore[union-attr]  # (every slot behind the first waits)
            if heir is not None:
                heir.lead = True
                heir.done.set()  # type: ignore[union-attr]
        if failed is not None:
            if len(batch) == 1:
                raise failed
            return self._one(item)  # (the batch failed: this item alone, as every other caller does)
        return batch[0].result  # type: ignore[return-value]
