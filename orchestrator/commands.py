"""Starting COMMAND for one message of a conversation, and ending a conversation's processes.

COMMAND is started through a tiny launcher, a child in its own session: it puts the message on
COMMAND's stdin, sends COMMAND's stderr to a file (its tail goes to Linear if COMMAND fails),
records durably that the start happened (the `started/<messageId>` marker, holding its pid: a
later stop finds the process group by it), takes the message out of the inbox, then runs COMMAND
as its child in the same session and waits for it. It ignores SIGTERM and SIGINT itself (COMMAND
gets the group's signal and decides), records how COMMAND ended (`exited/<messageId>`: the exit
code, or -N for signal N) and ends the same way, so its parent reads COMMAND's own status. It is
independent of the orchestrator once forked, so a crash anywhere around the fork neither loses
the start nor doubles it, and an orchestrator started later reads the exit code from the file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = """
import os, signal, sys
marker, message, errors, taken, exited = sys.argv[1:6]
fd = os.open(message, os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
fd = os.open(errors, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
os.dup2(fd, 2)
os.close(fd)
fd = os.open(marker, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
os.write(fd, str(os.getpid()).encode())
os.fsync(fd)
os.close(fd)
if taken == "1":
    try:
        os.unlink(message)
    except FileNotFoundError:
        pass
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[6], sys.argv[6:])
    except OSError as exc:
        os.write(2, f"cannot run {sys.argv[6]}: {exc}\\n".encode())
        os._exit(127)
status = os.waitpid(pid, 0)[1]
code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
fd = os.open(exited, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
os.write(fd, str(code).encode())
os.fsync(fd)
os.close(fd)
if code < 0:
    try:
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL, SIGSTOP: never caught, never ignored
    os.kill(os.getpid(), -code)
os._exit(code if code >= 0 else 128 - code)
"""


@dataclass(frozen=True)
class Launch:
    marker: Path  # `started/<messageId>`: written by the launcher before COMMAND runs
    message: Path  # the message, on COMMAND's stdin
    errors: Path  # COMMAND's stderr
    taken_from_inbox: bool  # the message file is in the inbox: the launcher removes it
    exited: Path  # `exited/<messageId>`: written by the launcher when COMMAND has ended


def launch(spec: Launch, command: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCHER,
            str(spec.marker),
            str(spec.message),
            str(spec.errors),
            "1" if spec.taken_from_inbox else "0",
            str(spec.exited),
            *command,
        ],
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


def runs_message(pid: int, message_id: str) -> bool:
    """Whether `pid` is still COMMAND for this message (a pid can be reused: the process's own
    environment must name the message)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return alive(pid) and f"DEVPILOT_MESSAGE_ID={message_id}".encode() in environ.split(b"\0")


def alive(pid: int) -> bool:
    """A process that exists and has not ended (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def marker_pid(marker: Path) -> int:
    try:
        return int(marker.read_text() or "0")
    except (OSError, ValueError):
        return 0


def running_pid(marker: Path, message_id: str) -> int:
    """The pid in a `started/` marker while that process is still COMMAND for the message, else 0."""
    pid = marker_pid(marker)
    return pid if pid > 0 and runs_message(pid, message_id) else 0


def exit_code(exited: Path) -> int | None:
    """The exit code the launcher recorded in `exited/<messageId>` (-N: signal N), or None."""
    try:
        return int(exited.read_text())
    except (OSError, ValueError):
        return None


def end_groups(pids: list[int], grace: float, alive: Callable[[int], bool]) -> None:
    """SIGTERM to each process group (the launcher leads its session, COMMAND is in it), SIGKILL
    after `grace`."""
    _term_then_kill(pids, os.killpg, grace, alive)


def _term_then_kill(
    pids: list[int], send: Callable[[int, int], None], grace: float, alive: Callable[[int], bool]
) -> None:
    """SIGTERM to each of `pids` (by `send`: to a process, or to its group), SIGKILL to those still
    alive after `grace`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(pid, signal.SIGKILL)


def leftovers(setting: str) -> list[int]:
    """The live processes (not zombies) whose environment holds `setting` (a variable of COMMAND's
    own, which whatever it starts inherits), this one aside: what a COMMAND started in a session of
    its own (codex runs each shell command so), where its process group's signals do not reach.
    Read from /proc; where there is none, nothing is found."""
    entry, me, found = setting.encode(), os.getpid(), []
    proc_dir = Path("/proc")
    for proc in proc_dir.iterdir() if proc_dir.is_dir() else ():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            if entry in (proc / "environ").read_bytes().split(b"\0") and alive(int(proc.name)):
                found.append(int(proc.name))
        except OSError:  # (ended meanwhile, or another user's)
            continue
    return found


def end_leftovers(setting: str, grace: float) -> int:
    """`leftovers` of a stopped conversation: SIGTERM, SIGKILL after `grace`. How many there were."""
    pids = leftovers(setting)
    _term_then_kill(pids, os.kill, grace, alive)
    return len(pids)


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of COMMAND's stderr, fenced, for the `error` Linear gets."""
    try:
        text = "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])[-2000:]
    except OSError:
        return ""
    return f"\n\n```\n{text}\n```" if text.strip() else ""
