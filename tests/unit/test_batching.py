"""The group commit's hand-offs (shared/plumbing/batching.py), with real threads and no database."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from shared.plumbing.batching import Combiner, one_per_key


class Recorder:
    """`one` and `many` that record their calls; `one` can be held until released."""

    def __init__(self, fail_many: bool = False, bad: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.alone: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail_many = fail_many
        self.bad = bad

    def one(self, item: int) -> int:
        self.entered.set()
        self.hold.wait(10)
        self.alone.append(item)
        if item == self.bad:
            raise ValueError(f"bad item {item}")
        return item * 10

    def many(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        if self.fail_many:
            raise RuntimeError("the batch failed")
        return [i * 10 for i in items]


def waiting(c: Combiner[int, int]) -> int:
    return len(c._waiting)


def pile_up(
    c: Combiner[int, int], rec: Recorder, items: list[int], ex: ThreadPoolExecutor
) -> list[Future[int]]:
    """The first item leads and is held in `one`; the rest arrive meanwhile and wait in line."""
    rec.hold.clear()
    futures = [ex.submit(c.submit, items[0])]
    assert rec.entered.wait(5)
    futures += [ex.submit(c.submit, i) for i in items[1:]]
    deadline = time.monotonic() + 5
    while waiting(c) < len(items) - 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert waiting(c) == len(items) - 1
    rec.hold.set()
    return futures


def test_a_caller_alone_is_written_at_once_by_itself() -> None:
    rec = Recorder()
    c = Combiner(rec.many, rec.one, most=8)
    assert c.submit(3) == 30
    assert c.submit(4) == 40
    assert rec.alone == [3, 4] and rec.batches == []


def test_callers_that_arrive_while_a_batch_is_written_make_the_next_batch() -> None:
    rec = Recorder()
    c = Combiner(rec.many, rec.one, most=64)
    with ThreadPoolExecutor(12) as ex:
        futures = pile_up(c, rec, list(range(12)), ex)
        assert [f.result(5) for f in futures] == [i * 10 for i in range(12)]
    assert rec.alone == [0]
    assert len(rec.batches) == 1 and sorted(rec.batches[0]) == list(range(1, 12))
    assert c._leaders == 0 and waiting(c) == 0


def test_a_batch_holds_at_most_most_items_and_the_lead_passes_on() -> None:
    rec = Recorder()
    c = Combiner(rec.many, rec.one, most=3)
    with ThreadPoolExecutor(10) as ex:
        futures = pile_up(c, rec, list(range(10)), ex)
        assert [f.result(5) for f in futures] == [i * 10 for i in range(10)]
    assert [len(b) for b in rec.batches] == [3, 3, 3]
    assert sorted(i for b in rec.batches for i in b) == list(range(1, 10))
    assert c._leaders == 0 and waiting(c) == 0


def test_a_failed_batch_is_written_item_by_item_and_a_bad_item_fails_alone() -> None:
    rec = Recorder(fail_many=True, bad=5)
    c = Combiner(rec.many, rec.one, most=64)
    with ThreadPoolExecutor(8) as ex:
        futures = pile_up(c, rec, list(range(8)), ex)
        for i, f in enumerate(futures):
            if i == 5:
                with pytest.raises(ValueError, match="bad item 5"):
                    f.result(5)
            else:
                assert f.result(5) == i * 10
    assert len(rec.batches) == 1
    assert sorted(rec.alone) == list(range(8))  # the leader's own, then every item of the batch
    assert c._leaders == 0


def test_a_leader_that_fails_alone_raises_and_leaves_the_lead() -> None:
    rec = Recorder(bad=1)
    c = Combiner(rec.many, rec.one, most=8)
    with pytest.raises(ValueError):
        c.submit(1)
    assert c._leaders == 0
    assert c.submit(2) == 20


class Lanes:
    """`one` and `many` that record every item written and the most batches written at once."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.now = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def _write(self, items: list[int]) -> list[int]:
        with self.lock:
            self.now += 1
            self.most_at_once = max(self.most_at_once, self.now)
        time.sleep(0.002)  # (a batch's statement and commit, long enough for others to arrive)
        with self.lock:
            self.now -= 1
            self.written.extend(items)
        return [i * 10 for i in items]

    def one(self, item: int) -> int:
        return self._write([item])[0]

    def many(self, items: list[int]) -> list[int]:
        return self._write(items)


def test_a_second_caller_leads_in_a_second_lane_while_the_first_batch_is_written() -> None:
    rec = Recorder()
    c = Combiner(rec.many, rec.one, most=64, lanes=2)
    rec.hold.clear()
    with ThreadPoolExecutor(8) as ex:
        first = ex.submit(c.submit, 0)
        assert rec.entered.wait(5)
        rec.entered.clear()
        second = ex.submit(c.submit, 1)
        assert rec.entered.wait(5), "the second caller waited though a lane was free"
        rest = [ex.submit(c.submit, i) for i in range(2, 8)]
        deadline = time.monotonic() + 5
        while waiting(c) < 6 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert waiting(c) == 6 and c._leaders == 2  # both lanes busy: the rest wait in line
        rec.hold.set()
        assert [f.result(5) for f in [first, second, *rest]] == [i * 10 for i in range(8)]
    assert sorted(rec.alone) == [0, 1]
    assert sorted(i for b in rec.batches for i in b) == list(range(2, 8))  # each item once
    assert c._leaders == 0 and waiting(c) == 0


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_under_load_every_item_is_written_once_and_no_more_batches_run_than_lanes(lanes: int) -> None:
    rec = Lanes()
    c = Combiner(rec.many, rec.one, most=4, lanes=lanes)
    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(c.submit, range(400)))
    assert results == [i * 10 for i in range(400)]
    assert sorted(rec.written) == list(range(400))
    assert rec.most_at_once == lanes
    assert c._leaders == 0 and waiting(c) == 0


def test_one_per_key_writes_the_first_of_each_key_now_and_the_others_after() -> None:
    calls: list[list[str]] = []

    def write(batch: list[str]) -> list[str]:
        calls.append(batch)
        return [item.upper() for item in batch]

    items = ["a1", "b1", "a2", "c1", "a3", "b2"]
    assert one_per_key(items, lambda item: item[0], write) == [item.upper() for item in items]
    assert calls == [["a1", "b1", "c1"], ["a2", "b2"], ["a3"]]  # (no batch holds a key twice)
