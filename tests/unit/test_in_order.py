"""shared/plumbing/in_order.py: callers with one key run one at a time, first come first served."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from shared.plumbing import deadline
from shared.plumbing.in_order import InOrder


def _held(
    line: InOrder, key: str, leaving: Callable[[], None] = lambda: None
) -> tuple[threading.Thread, threading.Event]:
    """A thread that holds `key`'s place (returned once it does) until the event is set, and runs
    `leaving` just before it gives the place up."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with line.place(key):
            holding.set()
            release.wait(10)
            leaving()

    t = threading.Thread(target=hold)
    t.start()
    holding.wait(10)
    return t, release


def test_callers_of_one_key_run_one_at_a_time_in_arrival_order_and_other_keys_at_once() -> None:
    line = InOrder(30)
    ran: list[str] = []
    first, release = _held(line, "k", lambda: ran.append("first"))

    def later(name: str) -> None:
        with line.place("k"):
            ran.append(name)

    threads = [first]
    for name in ("second", "third", "fourth"):
        t = threading.Thread(target=later, args=(name,))
        t.start()
        threads.append(t)
        deadline_at = time.monotonic() + 10
        while line.waiting("k") < len(threads) and time.monotonic() < deadline_at:
            time.sleep(0.001)
    with line.place("other"):  # another key does not wait
        ran.append("other")
    release.set()
    for t in threads:
        t.join(10)
    assert ran == ["other", "first", "second", "third", "fourth"]
    assert line.waiting("k") == 0


def test_a_caller_waits_only_until_its_deadline_and_the_line_goes_on_without_it() -> None:
    line = InOrder(30)
    t, release = _held(line, "k")
    with deadline.bound(0.2), pytest.raises(deadline.Passed), line.place("k"):
        pass  # (never reached)
    assert line.waiting("k") == 1  # only the holder is left
    release.set()
    t.join(10)
    with line.place("k"):  # the line is free again
        assert line.waiting("k") == 1
    assert line.waiting("k") == 0
