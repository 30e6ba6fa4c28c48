"""orchestrator/wakeup.py: the wake-up signal handlers set (the orchestrator's loop, Granian's
master)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from orchestrator.wakeup import WakeupPipe
from tests.helpers.mid_call import run_script

ROOT = Path(__file__).resolve().parents[2]


def test_set_from_another_thread_wakes_a_wait_and_stays_set_until_cleared() -> None:
    wake = WakeupPipe()
    assert wake.wait(0.05) is False
    threading.Timer(0.1, wake.set).start()
    began = time.monotonic()
    assert wake.wait(10) is True
    assert time.monotonic() - began < 5  # woken by the set, not by the timeout
    assert wake.wait(0) is True and wake.is_set()  # still set: only clear() resets it
    wake.clear()
    assert wake.wait(0.05) is False and not wake.is_set()


# Runs in a child: the main thread sets, clears and waits on the wake-up, and a signal whose handler
# sets it lands inside one of those calls (the trace sends it at the call's second line: for a
# threading.Event, while the call holds the Event's lock). Prints "done" when the handler has run
# to its end and the main thread went on; with threading.Event the handler waits for ever on a lock
# its own thread holds.
_MID_CALL = """
import os, signal, sys
from orchestrator.wakeup import WakeupPipe
from tests.helpers.mid_call import done, signal_inside
wake = WakeupPipe()
method = sys.argv[1]
handled = []
signal.signal(signal.SIGUSR1, lambda signum, frame: (wake.set(), handled.append(signum)))
lines = signal_inside(wake, method, signal.SIGUSR1)
if method == "set":
    wake.set()
elif method == "clear":
    wake.clear()
else:
    wake.wait(0.01)
done()
assert len(lines) >= 2, lines
print("done", handled == [signal.SIGUSR1], wake.is_set(), flush=True)
"""


@pytest.mark.parametrize("method", ["set", "clear", "wait"])
def test_a_signal_handler_that_sets_it_inside_its_own_call_does_not_hang(method: str) -> None:
    hung = f"a signal handler setting the wake-up inside {method}() hung"
    assert run_script(_MID_CALL, method, hung=hung) == ["done", "True", "True"]
