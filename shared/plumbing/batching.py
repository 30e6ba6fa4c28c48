"""Group commit for concurrent requests: the items that arrive while a batch is being written are
written together in the next one.

Up to `lanes` callers lead at once, each writing a batch; a caller that finds a lane free leads at
once with its own item alone (a batch of one: nothing waits for company), and the others wait in
line. When a leader's batch is done, it wakes their callers with their results and, if anyone
waits, hands its lane to the first in line together with that caller's batch (the line, up to
`most`, taken at that moment, so no item is in two batches); so no caller leads for ever. A batch
that fails is retried item by item, each by its own caller, so one bad item fails only its own
request. The items that arrive while every lane is busy make the next batch: the busier, the larger.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("alone", "batch", "done", "item", "result")

    def __init__(self, item: T, waits: bool) -> None:
        self.item = item
        # Only a caller that waits needs something to wait on; one that leads at once (every
        # caller alone) is spared making it.
        self.done = threading.Event() if waits else None
        self.batch: list[_Slot[T, R]] | None = None  # handed the lead of this batch (itself first)
        self.alone = False  # its batch failed: the caller writes it alone
        self.result: R | None = None


class Combiner(Generic[T, R]):
    """`submit(item)` answers `one(item)`'s result, written in a batch (`many(items)`, a result
    per item, in order) with the items of concurrent callers, at most `most` at a time, and at most
    `lanes` batches at once. `one` None: an item alone is a batch of one."""

    def __init__(
        self,
        many: Callable[[list[T]], list[R]],
        one: Callable[[T], R] | None,
        most: int,
        lanes: int = 1,
    ) -> None:
        self._many = many
        self._one = one if one is not None else lambda item: many([item])[0]  # (a batch of one)
        self._most = most
        self._lanes = lanes
        self._lock = threading.Lock()
        self._waiting: list[_Slot[T, R]] = []
        # Callers leading a batch now. A caller waits only while every lane is taken, and a lane is
        # given up only when nobody waits, so whoever finds a free lane finds nobody waiting.
        self._leaders = 0

    @property
    def lanes(self) -> int:
        return self._lanes

    def submit(self, item: T) -> R:
        with self._lock:
            lead = self._leaders < self._lanes
            slot: _Slot[T, R] = _Slot(item, waits=not lead)
            if lead:
                self._leaders += 1
                slot.batch = [slot]
            else:
                self._waiting.append(slot)
        if slot.done is not None:
            slot.done.wait()
            if slot.batch is None:
                return self._one(item) if slot.alone else slot.result  # type: ignore[return-value]
        batch = slot.batch
        assert batch is not None  # (set before the slot was woken, or above)
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
            # The lane goes to the first caller in line, with the batch it leads: everything that
            # waits, up to `most`, taken here so that no slot is in two batches.
            with self._lock:
                heir = None
                if self._waiting:
                    nxt, self._waiting = self._waiting[: self._most], self._waiting[self._most :]
                    heir = nxt[0]
                    heir.batch = nxt
                else:
                    self._leaders -= 1
            for s in batch[1:]:
                s.done.set()  # type: ignore[union-attr]  # (every slot behind the first waits)
            if heir is not None:
                heir.done.set()  # type: ignore[union-attr]
        if failed is not None:
            if len(batch) == 1:
                raise failed
            return self._one(item)  # (the batch failed: this item alone, as every other caller does)
        return batch[0].result  # type: ignore[return-value]


def firsts(keys: Iterable[tuple[Hashable, ...]]) -> list[int]:
    """The positions of the items (given by their keys) that share no key with an item before them:
    the ones a batch statement writes. A key twice in one statement would match one written row
    twice; a later item that repeats one is left out and answered as not written, and its own
    request decides it (a copy: `duplicate`)."""
    seen: set[Hashable] = set()
    out: list[int] = []
    for i, item_keys in enumerate(keys):
        if seen.isdisjoint(item_keys):
            out.append(i)
        seen.update(item_keys)
    return out


def one_per_key(items: list[T], key: Callable[[T], Hashable], write: Callable[[list[T]], list[R]]) -> list[R]:
    """`write`'s result for each of `items`, in order, where `write` is given no two items of one
    `key`: the first of each key written now, in one call; the others after it, in calls of their
    own, as they would be had they come later (a batch that holds turns by key must not hold one
    twice: the second would find nothing of the first's)."""
    first = firsts((key(item),) for item in items)
    out: dict[int, R] = dict(zip(first, write([items[i] for i in first]), strict=True))
    later = [i for i in range(len(items)) if i not in out]
    if later:
        out.update(zip(later, one_per_key([items[i] for i in later], key, write), strict=True))
    return [out[i] for i in range(len(items))]
