"""Structured logs: JSON objects off a terminal, `key=value` text on one (every entry point)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from typing import TextIO


class Fields(dict[str, object]):
    """A structured log line: `log.info("%s", Fields(...))`. Our formatter takes the fields as they
    are (one JSON encoding per line, not an encode here and a decode-and-encode in the handler);
    any other handler sees the JSON text, made only if it asks."""

    def __str__(self) -> str:
        return json.dumps(self, separators=(",", ":"), default=str)


class StructuredFormatter(logging.Formatter):
    """Every line structured: JSON objects when not on a terminal (request lines are already JSON;
    other records are wrapped), `key=value` text on a terminal."""

    def __init__(self, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: object = record.args  # (logging unwraps a lone mapping argument)
        if not isinstance(fields, Fields):
            msg = record.getMessage()
            try:
                fields = json.loads(msg) if msg.startswith("{") else None
            except json.JSONDecodeError:
                fields = None
        if not isinstance(fields, dict):
            fields = {"msg": record.getMessage()}
        fields = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            **fields,
        }
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.as_json:
            return json.dumps(fields, separators=(",", ":"), default=str)
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        rest = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("ts", "level", "logger", "msg"))
        return f"{stamp} {fields['level']:<7} {fields.get('msg', '')} {rest}".rstrip()


class BatchedStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """`devpilot serve`'s handler: lines below WARNING are written together every `every` seconds by
    a thread of their own, where a plain StreamHandler writes and flushes each line on the request's
    own thread. Under load, every such write let the other request threads take the interpreter and
    wait for it back: the access line alone doubled the server CPU of a request that does nothing
    (bench/README.md, "The request log line"). A WARNING or worse goes out at once, after what
    waits. What waits is lost with a process that is SIGKILLed (at most `every` seconds of lines);
    it is written when the process stops (`flush`: logging's own at exit, the serve worker's at its
    stop and before it leaves with a SIGKILLed master). A write that fails loses its own lines, as a
    StreamHandler loses a line it cannot write, and the writer goes on.
    """

    def __init__(self, stream: TextIO, every: float = 0.05) -> None:
        super().__init__(stream)
        self.every = every
        self._pending: list[str] = []
        self._writer: int | None = None  # the process whose writer thread runs
        # A fork waits for a write in progress (the child must not inherit the stream's own lock
        # held by the writer thread); the child starts with nothing waiting (its parent writes its
        # own lines) and starts its own writer on its first line. (logging itself gives the child a
        # fresh handler lock.)
        os.register_at_fork(
            before=self.acquire, after_in_parent=self.release, after_in_child=self._pending.clear
        )

    def emit(self, record: logging.LogRecord) -> None:  # (called holding the handler's lock)
        try:
            self._pending.append(self.format(record))
            if record.levelno >= logging.WARNING:
                self._write()
            elif self._writer != os.getpid():  # (marked once started: a failed start is tried again)
                threading.Thread(target=self._run, name="devpilot-log-writer", daemon=True).start()
                self._writer = os.getpid()
        except Exception:
            self.handleError(record)

    def _write(self) -> None:
        if self._pending:
            lines = "\n".join(self._pending) + "\n"
            self._pending.clear()
            self.stream.write(lines)
            self.stream.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # (made by Handler.__init__)
            self._write()

    def _run(self) -> None:
        while True:
            time.sleep(self.every)
            # A pipe full or gone for a moment: the lines of that write are lost, the next ones are not.
            with contextlib.suppress(Exception):
                self.flush()


def setup_logging(level: int = logging.INFO, batched: bool = False) -> None:
    """The `devpilot` loggers' one handler, to stderr; `batched` (`devpilot serve`) writes what is
    below WARNING together a few times a second (BatchedStreamHandler). A function instance writes
    each line at once: its platform may freeze it, or take its CPU, between requests."""
    root = logging.getLogger("devpilot")
    if batched:
        # What no line of ours shows, not gathered for each record (the logging HOWTO's
        # "Optimization"): the caller's file and line, thread, process and process name.
        logging._srcfile = None
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    if not root.handlers:
        h = BatchedStreamHandler(sys.stderr) if batched else logging.StreamHandler(sys.stderr)
        h.setFormatter(StructuredFormatter(as_json=not sys.stderr.isatty()))
        root.addHandler(h)
        root.setLevel(level)
        root.propagate = False


def flush_logs() -> None:
    """Whatever the `devpilot` handlers hold, written now."""
    for h in logging.getLogger("devpilot").handlers:
        h.flush()
