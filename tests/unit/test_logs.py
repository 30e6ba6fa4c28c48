"""`devpilot serve`'s log handler (functions/logs.py BatchedStreamHandler): lines below WARNING wait
for the writer thread, a WARNING goes out at once after them, and nothing waiting is lost at a stop
or written twice by a fork."""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Iterator

import pytest

from functions.logs import BatchedStreamHandler, Fields, StructuredFormatter


def handler(out: io.StringIO, every: float = 3600) -> BatchedStreamHandler:
    """A handler writing JSON lines to `out` (by default its writer thread never comes round)."""
    h = BatchedStreamHandler(out, every=every)
    h.setFormatter(StructuredFormatter(as_json=True))
    return h


def record(msg: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.makeLogRecord(
        {"name": "devpilot.t", "levelno": level, "levelname": logging.getLevelName(level), "msg": msg}
    )


@pytest.fixture
def logged() -> Iterator[tuple[logging.Logger, io.StringIO, BatchedStreamHandler]]:
    out = io.StringIO()
    h = handler(out)
    log = logging.getLogger(f"devpilot.test-logs-{time.monotonic_ns()}")
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(h)
    yield log, out, h
    log.removeHandler(h)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_info_lines_wait_and_a_warning_writes_them_first_then_itself(
    logged: tuple[logging.Logger, io.StringIO, BatchedStreamHandler],
) -> None:
    log, out, _ = logged
    log.info("%s", Fields({"route": "claim", "status": 200}))
    log.info("%s", Fields({"route": "ack", "status": 200}))
    assert out.getvalue() == ""
    log.warning("database unavailable on %s", "claim")
    assert [(x["level"], x.get("route", x.get("msg"))) for x in lines(out)] == [
        ("info", "claim"),
        ("info", "ack"),
        ("warning", "database unavailable on claim"),
    ]


def test_flush_writes_what_waits_once(
    logged: tuple[logging.Logger, io.StringIO, BatchedStreamHandler],
) -> None:
    log, out, h = logged
    log.info("%s", Fields({"route": "webhook", "status": 200}))
    h.flush()
    h.flush()
    assert [x["route"] for x in lines(out)] == ["webhook"]


def test_the_writer_thread_writes_without_being_asked() -> None:
    out = io.StringIO()
    h = handler(out, every=0.01)
    h.handle(record("hi"))
    deadline = time.monotonic() + 5
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [x["msg"] for x in lines(out)] == ["hi"]


def test_a_forked_child_does_not_write_its_parents_waiting_lines() -> None:
    r, w = os.pipe()
    out = io.StringIO()
    h = handler(out)
    h.handle(record("parent's"))
    pid = os.fork()
    if pid == 0:  # the child: what it writes is only its own line
        os.close(r)
        h.handle(record("child's", logging.WARNING))
        os.write(w, out.getvalue().encode())
        os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(r) as child:
        written = child.read()
    assert status == 0
    assert [json.loads(line)["msg"] for line in written.splitlines()] == ["child's"]
    h.flush()
    assert [x["msg"] for x in lines(out)] == ["parent's"]


class FailsOnce(io.StringIO):
    """A stream whose first write fails, as a pipe that is full or gone for a moment."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def write(self, s: str) -> int:
        if not self.failed:
            self.failed = True
            raise BlockingIOError("stderr's pipe is full")
        return super().write(s)


def test_a_write_that_fails_loses_its_lines_and_the_writer_goes_on() -> None:
    out = FailsOnce()
    h = handler(out, every=0.01)
    h.handle(record("lost"))
    deadline = time.monotonic() + 5
    while not out.failed and time.monotonic() < deadline:
        time.sleep(0.01)
    h.handle(record("written"))
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [x["msg"] for x in lines(out)] == ["written"]
