"""For a child process's script: make a signal land inside a call on purpose.

`signal_inside(obj, method, sig)` traces calls until `obj.<method>` runs, and sends `sig` to this
process at that call's second line (for a `threading.Event`, while the call holds the Event's
lock), once. What the test checks is that the signal's handler, run there, neither hangs nor breaks
the call. Used by the wake-up's tests (tests/unit/test_wakeup.py, tests/test_serve.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any


def signal_inside(obj: object, method: str, sig: int) -> list[int]:
    """Start tracing; the lines seen inside the call (at least two once it ran). `done()` stops."""
    lines: list[int] = []

    def inside(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            lines.append(frame.f_lineno)
            if len(lines) == 2:
                os.kill(os.getpid(), sig)
        return inside

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        if (
            event == "call"
            and frame.f_code.co_name == method
            and frame.f_locals.get("self") is obj
            and not lines
        ):
            return inside
        return None

    sys.settrace(calls)
    return lines


def done() -> None:
    sys.settrace(None)


def run_script(script: str, *args: str, hung: str) -> list[str]:
    """Run `script` (Python source) in a child with the repo importable; its stdout's words. A
    child that has not ended within 20 s is SIGKILLed (a handler that hangs ignores SIGTERM) and
    the test fails with `hung`."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(hung) from None
    assert proc.returncode == 0, err[-2000:]
    return out.split()
