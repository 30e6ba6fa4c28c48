"""The agent's CLI as the runner's child: in a process group of its own, so Linear's stop (SIGTERM
to the COMMAND's group) reaches the runner alone, which asks the agent to stop and lets it end
cleanly; and, on Linux, killed by the kernel if the runner dies first (the orchestrator's SIGKILL
after the grace), so no agent outlives its COMMAND."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _dies_with(parent: int) -> None:
    """In the child, before exec: SIGKILL when the parent dies (and now, if it already has)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def start(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    parent = os.getpid()
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        process_group=0,
        preexec_fn=lambda: _dies_with(parent),  # (the runner is one thread when it starts it)
    )


def end(proc: subprocess.Popen[bytes], grace: float) -> int:
    """Wait up to `grace` seconds for it to end by itself, then SIGTERM its group, then SIGKILL.
    Its exit code (-N: signal N)."""
    deadline = time.monotonic() + grace
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            deadline = time.monotonic() + 2.0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is not None:
            break
    return proc.wait()
