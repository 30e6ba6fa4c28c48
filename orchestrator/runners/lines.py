"""The agent's CLI as a child that speaks JSON, one object a line: what it writes on stdout (its
events), what it is sent on stdin, and its stderr, passed through to the runner's (the COMMAND's
log in the orchestrator's state dir) with its last lines kept to name a crash's cause."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
from collections import deque
from typing import Any


class JsonLines:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.open = True  # its stdout: closed once it ended
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._out, self._err = b"", b""
        self._err_open = True

    def read(self, timeout: float) -> list[dict[str, Any]]:
        """What it wrote (waiting up to `timeout` seconds for something): its events, in order."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()
        fds = [fd for fd, live in ((out, self.open), (err, self._err_open)) if live]
        if not fds:
            return []
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:  # (a signal: the runner's loop looks at it)
            return []
        events: list[dict[str, Any]] = []
        for fd in readable:
            chunk = os.read(fd, 1 << 16)
            if fd == err:
                self._stderr(chunk)
            elif not chunk:
                self.open = False
            else:
                events += self._stdout(chunk)
        return events

    def send(self, line: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ValueError):  # (it ended: its stdout closes next)
            self.proc.stdin.write((json.dumps(line) + "\n").encode())
            self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()

    def tail(self) -> str:
        """Its stderr's last lines, as a block to quote (empty when it said nothing)."""
        said = "\n".join(self.stderr_tail).strip()
        return f"\n\n```\n{said[-1500:]}\n```" if said else ""

    def _stdout(self, chunk: bytes) -> list[dict[str, Any]]:
        self._out += chunk
        *lines, self._out = self._out.split(b"\n")
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                self._stderr(line + b"\n")
                continue
            if isinstance(event, dict):
                events.append(event)
        return events

    def _stderr(self, chunk: bytes) -> None:
        if not chunk:
            self._err_open = False
            return
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        self._err += chunk
        *lines, self._err = self._err.split(b"\n")
        self.stderr_tail.extend(line.decode("utf-8", "replace") for line in lines)
