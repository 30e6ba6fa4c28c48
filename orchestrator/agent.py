"""The orchestrator loop: claim until empty on every wake-up, journal, ack, then start COMMAND.

Transports only decide when to look: `poll` every interval (fully correct on its own), `listen`
long-polls /claim, `realtime` claims on each Supabase event and polls when the socket is away.
Every wake-up of any kind claims until the queue is empty: that is the reconnect sweep.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from orchestrator.client import Api, Rejected, Unreachable
from orchestrator.journal import Journal, private_dir
from orchestrator.log import Log

Transport = Literal["poll", "listen", "realtime"]
TOKEN_ENV = "DEVPILOT_ORCHESTRATOR_TOKEN"


def is_uuid(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


LONG_POLL_SECONDS = 20
REALTIME_BACKSTOP_SECONDS = 30.0


# Runs in the child before COMMAND: puts the message file on stdin, records durably that the start
# happened (the marker), then becomes COMMAND. Independent of the orchestrator once forked.
LAUNCHER = """
import os, sys
marker, message = sys.argv[1], sys.argv[2]
fd = os.open(message, os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
fd = os.open(marker, os.O_CREAT | os.O_WRONLY, 0o600)
os.fsync(fd)
os.close(fd)
os.execvp(sys.argv[3], sys.argv[3:])
"""


class Shutdown(Exception):
    """Raised out of a blocking wait when SIGTERM/SIGINT arrives and nothing is in flight."""


@dataclass
class Config:
    url: str
    token: str
    command: list[str]
    transport: Transport = "poll"
    poll_interval: float = 5.0
    state_dir: Path = field(default_factory=lambda: default_state_dir())
    max_parallel: int = 4
    json_logs: bool = False


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "devpilot-orchestrator"


class Orchestrator:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.log = Log(cfg.json_logs)
        self.api = Api(cfg.url, cfg.token)
        self.journal = Journal(private_dir(cfg.state_dir) / "journal.sqlite3")
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.stopping = False
        self._critical = 0  # > 0 while an ack is in flight: SIGTERM waits for it
        self._wake = threading.Event()
        self._away_since: float | None = None
        self._backoff = 0.5
        self._realtime: Any = None
        self._realtime_said = False
        self._closing = False
        self.names: dict[str, str] = {}

    # --- signals -----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = not self.stopping
        self.stopping = True
        self._wake.set()
        if first and self._critical == 0 and not self._closing:
            raise Shutdown()

    # --- main --------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.log(
            "start",
            f"orchestrator up: {self.cfg.url} via {self.cfg.transport}, state in {self.cfg.state_dir}",
        )
        try:
            self._resume()
            if self.cfg.transport == "realtime":
                self._start_realtime()
            while not self.stopping:
                try:
                    self._cycle()
                    self._came_back()
                except Unreachable as exc:
                    self._went_away(str(exc))
                    self._sleep(self._next_backoff())
        except Shutdown:
            pass
        except Rejected as exc:
            self.log("rejected", f"token rejected by the service: {exc}")
            return 3
        finally:
            self._closing = True
            if self._realtime is not None:
                self._realtime.stop()
            self.journal.close()
            self.api.close()
        self.log("stop", "stopped: nothing new started")
        return 0

    def _cycle(self) -> None:
        self._reap()
        self.drain()
        if self.stopping:
            return
        if self.cfg.transport == "listen":
            capacity = self._capacity()
            if capacity > 0:
                for m in self.api.claim(capacity, wait_seconds=LONG_POLL_SECONDS):
                    self._process(m)
                return
            self._sleep(0.5)
        elif (
            self.cfg.transport == "realtime"
            and self._realtime is not None
            and self._realtime.connected.is_set()
        ):
            self._wait_wake(REALTIME_BACKSTOP_SECONDS)
        else:
            self._wait_wake(self.cfg.poll_interval * random.uniform(0.8, 1.2))

    def drain(self) -> None:
        """Claim until empty (or until --max-parallel commands are running)."""
        while not self.stopping:
            self._reap()
            capacity = self._capacity()
            if capacity <= 0:
                return
            batch = self.api.claim(min(capacity, 100))
            if not batch:
                return
            for m in batch:
                if self.stopping:
                    return
                self._process(m)

    # --- one message -------------------------------------------------------------------------
    def _process(self, m: dict[str, Any]) -> None:
        """Journal, ack, start: SIGTERM never interrupts this, it waits for the end of it."""
        self._critical += 1
        try:
            self._process_inner(m)
        finally:
            self._critical -= 1  # if SIGTERM came meanwhile, the loop sees `stopping`

    def _process_inner(self, m: dict[str, Any]) -> None:
        if not is_uuid(m.get("messageId")):
            # The id names files in the state dir: anything but a UUID (a path, a NUL byte) is
            # refused before it is written anywhere or started; the loop goes on.
            self.log(
                "refused", f"refused a message whose messageId is not a UUID: {m.get('messageId')!r:.80}"
            )
            return
        name = (m.get("issue") or {}).get("identifier") or m["messageId"]
        seen = self.journal.get(m["messageId"])
        self.log(
            "claimed",
            f"claimed {name} (attempt {m['attempt']})",
            messageId=m["messageId"],
            queueId=m["queueId"],
            attempt=m["attempt"],
        )
        if seen is not None and (
            seen.state == "started" or (seen.state == "starting" and self._marker(m["messageId"]).exists())
        ):
            self._ack(m, name)  # the earlier ack was lost; never start twice
            self.log(
                "duplicate",
                f"{name} already started here; acked again, not restarted",
                messageId=m["messageId"],
            )
            return
        self.journal.record(m)
        result = self._ack(m, name)
        if result == "acked":
            self.journal.mark(m["messageId"], "acked")
            if not self.stopping:
                self._start(m, name)
        elif result == "abandoned":
            self.log("abandoned", f"{name}: stopping while the service is away; acks on next run")
        elif result == "claim_superseded":
            self.journal.forget(m["messageId"])
            self.log("superseded", f"{name}: a newer claim owns it; dropped", messageId=m["messageId"])
        else:
            self.journal.forget(m["messageId"])
            self.log("gone", f"{name}: cancelled or expired on the server; dropped", messageId=m["messageId"])

    def _ack(self, m: dict[str, Any], name: str) -> str:
        """Ack, retrying through network loss (a late ack of the latest claim still counts)."""
        while True:
            try:
                result = self.api.ack(m["queueId"], m["claimToken"])
                self._came_back()
                if result == "acked":
                    self.log("acked", f"acked {name}", messageId=m["messageId"], queueId=m["queueId"])
                return result
            except Unreachable as exc:
                self._went_away(str(exc))
                if self.stopping:
                    return "abandoned"  # still journaled: the redelivery after restart acks it
                time.sleep(self._next_backoff())

    def _marker(self, message_id: str) -> Path:
        return self.cfg.state_dir / "started" / message_id

    def _start(self, m: dict[str, Any], name: str) -> None:
        mid = m["messageId"]
        if self._marker(mid).exists():  # the launcher ran before a crash: never start twice
            self.journal.mark(mid, "started")
            self.log("duplicate", f"{name} was already started before the last stop", messageId=mid)
            return
        issue = m.get("issue") or {}
        env = {
            # Everything this process has, except the machine's own token: COMMAND never holds it.
            **{k: v for k, v in os.environ.items() if k != TOKEN_ENV and v != self.cfg.token},
            "DEVPILOT_MESSAGE_ID": mid,
            "DEVPILOT_SESSION_ID": m["sessionId"],
            "DEVPILOT_QUEUE_ID": m["queueId"],
            "DEVPILOT_ISSUE_ID": str(issue.get("id") or ""),
            "DEVPILOT_ISSUE_IDENTIFIER": str(issue.get("identifier") or ""),
            "DEVPILOT_ISSUE_URL": str(issue.get("url") or ""),
        }
        # The message goes to a file the launcher puts on COMMAND's stdin, so COMMAND gets it whole
        # even if this process dies right after the fork.
        msg_file = private_dir(self.cfg.state_dir / "messages") / f"{mid}.json"
        private_dir(self._marker(mid).parent)
        with open(
            os.open(msg_file, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600), "w", encoding="utf-8"
        ) as f:
            f.write(json.dumps(m))
            f.flush()
            os.fsync(f.fileno())
        self.journal.mark(mid, "starting")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, str(self._marker(mid)), str(msg_file), *self.cfg.command],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self.log("error", f"could not start {name}: {exc}", messageId=mid)
            return
        self.journal.mark(mid, "started")
        self.running[mid] = proc
        self.names[mid] = name
        self.log("started", f"started {name} (pid {proc.pid})", messageId=mid, pid=proc.pid)

    def _resume(self) -> None:
        """After a crash: finish what the journal shows was interrupted. A `journaled` entry is
        acked again with its own token (a repeated ack answers `acked`), then started; an `acked`
        one is started."""
        self._critical += 1
        try:
            for entry in self.journal.unfinished():
                m = entry.message
                name = (m.get("issue") or {}).get("identifier") or entry.message_id
                if entry.state == "journaled":
                    result = self._ack(m, name)
                    if result == "abandoned":
                        continue
                    if result != "acked":
                        self.journal.forget(entry.message_id)
                        continue
                    self.journal.mark(entry.message_id, "acked")
                if self.stopping:
                    return
                self.log("resume", f"resuming {name}: acked before the last stop, not yet started")
                self._start(m, name)
        finally:
            self._critical -= 1

    def _reap(self) -> None:
        for mid, proc in list(self.running.items()):
            code = proc.poll()
            if code is not None:
                del self.running[mid]
                name = self.names.pop(mid, mid)
                self.log("finished", f"{name} finished with exit code {code}", messageId=mid, exitCode=code)

    def _capacity(self) -> int:
        return self.cfg.max_parallel - len(self.running)

    # --- waiting and connectivity -----------------------------------------------------------
    def _wait_wake(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)

    def _next_backoff(self) -> float:
        delay = self._backoff * random.uniform(0.5, 1.5)
        self._backoff = min(self._backoff * 2, 30.0)
        return delay

    def _went_away(self, why: str) -> None:
        if self._away_since is None:
            self._away_since = time.monotonic()
            self.log("away", f"service unreachable ({why}); retrying with backoff")

    def _came_back(self) -> None:
        if self._away_since is not None:
            gone = time.monotonic() - self._away_since
            self._away_since = None
            self.log("back", f"service reachable again after {gone:.1f}s")
        self._backoff = 0.5

    def _start_realtime(self) -> None:
        try:
            from orchestrator.realtime_wake import RealtimeWake
        except ImportError:
            self.log("realtime", "realtime extra not installed; polling instead")
            return

        def on_state(state: str, detail: str) -> None:
            if state == "up":
                self._realtime_said = False
                self.log("realtime", "realtime connected: claiming on every insert")
            elif not self._realtime_said:
                self._realtime_said = True
                self.log(
                    "realtime", f"realtime unavailable ({detail}); polling every {self.cfg.poll_interval:g}s"
                )

        self._realtime = RealtimeWake(self.api, self._wake.set, on_state)
        self._realtime.start()
