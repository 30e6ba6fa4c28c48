"""The orchestrator loop: claim until empty on every wake-up, journal, ack, then start COMMAND.

Transports only decide when to look: `poll` every interval (fully correct on its own), `listen`
long-polls /claim, `realtime` claims on each Supabase event and polls when the socket is away.
Every wake-up of any kind claims until the queue is empty: that is the reconnect sweep.
"""

from __future__ import annotations

import contextlib
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
from shared import agent_tokens

Transport = Literal["poll", "listen", "realtime"]
TOKEN_ENV = "DEVPILOT_ORCHESTRATOR_TOKEN"  # the variable's name, not its value  # nosec B105


def is_uuid(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


LONG_POLL_SECONDS = 20
REALTIME_BACKSTOP_SECONDS = 30.0


# Runs in the child before COMMAND: puts the message file on stdin and COMMAND's stderr in a file
# (its tail goes to Linear if COMMAND fails), records durably that the start happened (the marker,
# holding the pid: a later stop finds the process by it), then becomes COMMAND. Independent of the
# orchestrator once forked.
LAUNCHER = """
import os, sys
marker, message, errors = sys.argv[1], sys.argv[2], sys.argv[3]
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
os.execvp(sys.argv[4], sys.argv[4:])
"""
ACTIVITY_IDS = uuid.UUID("5b0f7c52-2f7c-4d61-9a55-8c1c2a4e9d10")  # namespace of our own activity ids
TAIL_LINES = 20


class Shutdown(Exception):
    """Raised out of a blocking wait when SIGTERM/SIGINT arrives and nothing is in flight."""


@dataclass
class Config:
    url: str | None  # one base URL serving every route, or
    token: str
    command: list[str]
    transport: Transport = "poll"
    poll_interval: float = 5.0
    state_dir: Path = field(default_factory=lambda: default_state_dir())
    max_parallel: int = 4
    json_logs: bool = False
    stop_grace: float = 10.0  # seconds between SIGTERM and SIGKILL when Linear says stop
    endpoints: dict[str, str] | None = None  # each route's own URL (a cloud deploy)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "devpilot-orchestrator"


class Orchestrator:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.log = Log(cfg.json_logs)
        self.api = Api(cfg.url, cfg.token, endpoints=cfg.endpoints)
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
        self.messages: dict[str, dict[str, Any]] = {}
        self.stopped: set[str] = set()  # message ids whose process a stop ended: no exit report

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
            f"orchestrator up: {self.cfg.url or 'endpoints ' + self.api.endpoints['claim']} via "
            f"{self.cfg.transport}, state in {self.cfg.state_dir}",
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
        if m.get("kind") == "stop":
            self._stop(m, name)
            return
        issue = m.get("issue") or {}
        agent = m.get("agentSessionId")
        env = {
            # Everything this process has, except the machine's own token: COMMAND never holds it.
            **{k: v for k, v in os.environ.items() if k != TOKEN_ENV and v != self.cfg.token},
            "DEVPILOT_MESSAGE_ID": mid,
            "DEVPILOT_SESSION_ID": m["sessionId"],
            "DEVPILOT_QUEUE_ID": m["queueId"],
            "DEVPILOT_ISSUE_ID": str(issue.get("id") or ""),
            "DEVPILOT_ISSUE_IDENTIFIER": str(issue.get("identifier") or ""),
            "DEVPILOT_ISSUE_URL": str(issue.get("url") or ""),
            "DEVPILOT_KIND": str(m.get("kind") or "start"),
            "DEVPILOT_PROMPT": str((m.get("prompt") or {}).get("body") or ""),
        }
        if agent:
            # What `devpilot-orchestrator activity` needs to speak in this agent session, and only it.
            env.update(
                {
                    "DEVPILOT_AGENT_SESSION_ID": agent,
                    "DEVPILOT_ACTIVITIES_URL": self.api.endpoints.get("activities", ""),
                    "DEVPILOT_AGENT_TOKEN": agent_tokens.mint(self.cfg.token, m["orchestratorId"], agent),
                    "DEVPILOT_RESPONDED_FILE": str(private_dir(self.cfg.state_dir / "responded") / mid),
                }
            )
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
            errors = private_dir(self.cfg.state_dir / "logs") / f"{mid}.stderr"
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    LAUNCHER,
                    str(self._marker(mid)),
                    str(msg_file),
                    str(errors),
                    *self.cfg.command,
                ],
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
        self.messages[mid] = m
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
                m = self.messages.pop(mid, {})
                self.log("finished", f"{name} finished with exit code {code}", messageId=mid, exitCode=code)
                if m.get("agentSessionId") and mid not in self.stopped:
                    self._report_exit(m, code)
                self.stopped.discard(mid)

    # --- agent sessions ----------------------------------------------------------------------
    def _report_exit(self, m: dict[str, Any], code: int) -> None:
        """COMMAND ended without its own final word: Linear completes a session on a `response`,
        and shows an `error`; say it for COMMAND (with a stable id: said once, even if repeated)."""
        mid = m["messageId"]
        if (self.cfg.state_dir / "responded" / mid).exists():
            return
        if code == 0:
            content = {"type": "response", "body": "Finished."}
        else:
            content = {"type": "error", "body": f"The agent exited with code {code}.{self._tail(mid)}"}
        self._post_activity(m["agentSessionId"], content, f"{mid}:exit")

    def _tail(self, mid: str) -> str:
        path = self.cfg.state_dir / "logs" / f"{mid}.stderr"
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
        except OSError:
            return ""
        text = "\n".join(lines)[-2000:]
        return f"\n\n```\n{text}\n```" if text.strip() else ""

    def _post_activity(self, agent_session_id: str, content: dict[str, Any], key: str) -> None:
        # Stable for this message and purpose (said once, even when posted again after a restart),
        # and shaped as the UUID v4 the service takes.
        activity_id = str(uuid.UUID(bytes=uuid.uuid5(ACTIVITY_IDS, key).bytes, version=4))
        for attempt in range(3):
            try:
                status = self.api.activity(agent_session_id, content, activity_id)
                self.log("activity", f"{content['type']} for agent session {agent_session_id}: {status}")
                return
            except Unreachable as exc:
                self._went_away(str(exc))
                time.sleep(self._next_backoff() if attempt < 2 else 0)
        self.log("activity", f"could not post a {content['type']} for agent session {agent_session_id}")

    def _stop(self, m: dict[str, Any], name: str) -> None:
        """Linear's stop: end every process this machine runs for the agent session (SIGTERM to its
        process group, then SIGKILL after the grace period) and post the final response."""
        mid, agent = m["messageId"], m.get("agentSessionId") or ""
        self.journal.mark(mid, "starting")
        groups = self._agent_processes(agent)
        for pid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.stop_grace
        while groups and time.monotonic() < deadline and any(self._alive(pid) for pid in groups):
            time.sleep(0.05)
        for pid in groups:
            if self._alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        self._post_activity(
            agent, {"type": "response", "body": "Stopped, as asked in Linear."}, f"{mid}:stop"
        )
        fd = os.open(self._marker(mid), os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
        self.journal.mark(mid, "started")
        self.log(
            "stopped",
            f"{name}: stopped agent session {agent} ({len(groups)} process group(s))",
            messageId=mid,
        )

    def _agent_processes(self, agent: str) -> list[int]:
        """Process groups (= pids: COMMAND leads its own session) running for the agent session: ones
        this process started, and ones an earlier run started, found by the marker's pid and checked
        to still carry that message's id (a pid can be reused)."""
        pids: list[int] = []
        for mid, proc in self.running.items():
            if self.messages.get(mid, {}).get("agentSessionId") == agent and proc.poll() is None:
                pids.append(proc.pid)
                self.stopped.add(mid)
        for mid in self.journal.started_in(agent):
            if mid in self.running:
                continue
            try:
                pid = int(self._marker(mid).read_text() or "0")
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except (OSError, ValueError):
                continue
            if pid > 0 and f"DEVPILOT_MESSAGE_ID={mid}".encode() in environ.split(b"\0"):
                pids.append(pid)
        return pids

    def _alive(self, pid: int) -> bool:
        for proc in self.running.values():
            if proc.pid == pid:
                return proc.poll() is None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

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
