"""The orchestrator loop: claim until empty on every wake-up; journal each message, hand it to its
conversation, ack it; start COMMAND for a conversation's next message when none of its runs.

Transports only decide when to look: `poll` every interval (fully correct on its own), `listen`
long-polls /claim, `realtime` claims on each Supabase event and polls when the socket is away.
Every wake-up of any kind claims until the queue is empty: that is the reconnect sweep.

A conversation (an agent session) is one thread on this machine: at most one COMMAND of it runs at
a time; a follow-up that arrives meanwhile lands in that COMMAND's inbox; every COMMAND of it gets
the whole transcript and runs in the same directory (`orchestrator.conversations`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Literal

from orchestrator import commands
from orchestrator.client import Api, Rejected, Unreachable
from orchestrator.commands import Launch, launch
from orchestrator.conversations import (
    Conversation,
    Conversations,
    conversation_key,
    message_entry,
    message_id,
)
from orchestrator.housekeeping import Housekeeping
from orchestrator.journal import Journal
from orchestrator.log import Log
from orchestrator.messages import is_uuid, speaks_in
from orchestrator.messages import name as _name
from orchestrator.repositories import LocalRepo, told
from orchestrator.state import default_state_dir, private_dir
from orchestrator.workplace import Workplace
from orchestrator.worktrees import WorktreeError
from shared.models import REPOSITORY_MISSING, repository_key
from shared.wakeup import WakeupPipe

Transport = Literal["poll", "listen", "realtime"]


LONG_POLL_SECONDS = 20
# A long-poll while a conversation's next message waits for its running COMMAND to exit: short,
# so the next COMMAND starts soon after (a long-poll cannot be woken by the exit, as a poll's wait is).
SHORT_POLL_SECONDS = 1
REALTIME_BACKSTOP_SECONDS = 30.0
ACTIVITY_IDS = uuid.UUID("5b0f7c52-2f7c-4d61-9a55-8c1c2a4e9d10")  # namespace of our own activity ids
ANNOUNCE_RETRY_SECONDS = 60.0  # between tries to tell the service what this machine has
FINAL = ("response", "error")  # a conversation's last word: Linear completes the session on it


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
    pass_env: list[str] = field(default_factory=list)  # variables COMMAND gets from this environment
    worktree: bool = False  # each conversation in its own git worktree of the checkout run in
    workdir: Path = field(default_factory=Path.cwd)  # where COMMAND runs (the checkout, with --worktree)
    repositories: list[LocalRepo] = field(default_factory=list)  # --repo: checked out here, and where
    labels: list[str] = field(default_factory=list)  # --label
    keep_days: int = 14  # --keep-days: what is finished goes from the state dir after it (0: never)


@dataclass
class Running:
    """A COMMAND this process started: its message and the conversation it speaks in."""

    proc: subprocess.Popen[bytes]
    message: dict[str, Any]
    conv: Conversation
    name: str


@dataclass
class Earlier:
    """A COMMAND an earlier run of the orchestrator started, found running: not this process's
    child, so watched by its marker's pid, and its exit code read from `exited/<messageId>`."""

    pid: int
    message: dict[str, Any]
    conv: Conversation
    name: str


class Orchestrator:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.log = Log(cfg.json_logs)
        self.api = Api(cfg.url, cfg.token, endpoints=cfg.endpoints)
        self.journal = Journal(private_dir(cfg.state_dir) / "journal.sqlite3")
        self.conversations = Conversations(cfg.state_dir)
        self.running: dict[str, Running] = {}  # by message id
        self.earlier: dict[str, Earlier] = {}  # by message id: watched until reported
        self.stopping = False
        self._critical = 0  # > 0 inside `_uninterrupted` (an ack in flight, a last word): SIGTERM waits
        # Set from signal handlers (SIGCHLD, SIGTERM) and the realtime thread: a lock-free pipe, since
        # an Event's lock can be held by the very thread a handler interrupts (shared/wakeup.py).
        self._wake = WakeupPipe()
        self._away_since: float | None = None
        self._backoff = 0.5
        self._realtime: Any = None
        self._realtime_said = False
        self._closing = False
        self.stopped: set[str] = set()  # message ids whose process a stop ended: no exit report
        # Conversations that may have messages waiting in their inbox (all of them at start-up).
        self._waiting: dict[Path, Conversation] = {c.folder: c for c in self.conversations.all()}
        self._repos = {r.key: r for r in cfg.repositories}
        self.workplace = Workplace(
            token=cfg.token,
            state_dir=cfg.state_dir,
            workdir=cfg.workdir,
            worktree=cfg.worktree,
            repositories=cfg.repositories,
            pass_env=cfg.pass_env,
            endpoints=self.api.endpoints,
        )
        self.housekeeping = Housekeeping(
            cfg.state_dir,
            cfg.keep_days,
            self.journal,
            self.conversations,
            self.workplace,
            lambda: set(self.running) | set(self.earlier),
        )
        self._announced = False  # the service has heard what this machine has (`POST /machine`)
        self._announce_after = 0.0  # (monotonic) when to try telling it again

    # --- signals -----------------------------------------------------------------------------
    @contextmanager
    def _uninterrupted(self) -> Iterator[None]:
        """A block SIGTERM waits for: the handler sets `stopping` instead of raising, and the loop
        sees it afterwards."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        first = not self.stopping
        self.stopping = True
        self._wake.set()
        if first and self._critical == 0 and not self._closing:
            raise Shutdown()

    # --- main --------------------------------------------------------------------------------
    def run(self) -> int:
        self._wake.wake_on_signals()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        # A COMMAND that exits wakes the loop: its conversation's next message may start now.
        signal.signal(signal.SIGCHLD, lambda signum, frame: self._wake.set())
        self.log(
            "start",
            f"orchestrator up: {self.cfg.url or 'endpoints ' + self.api.endpoints['claim']} via "
            f"{self.cfg.transport}, state in {self.cfg.state_dir}",
        )
        try:
            self._find_earlier()  # (first: housekeeping must know every COMMAND that runs)
            self._housekeep()
            self._resume()
            if self.cfg.transport == "realtime":
                self._start_realtime()
            while not self.stopping:
                try:
                    self._cycle()
                    self._came_back()
                except Unreachable as exc:
                    self._went_away(str(exc))
                    self._wait_wake(self._next_backoff())
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
        self._housekeep()
        if not self._announced and time.monotonic() >= self._announce_after:
            self._announce()
        self._tend()
        self.drain()
        if self.stopping:
            return
        if self.cfg.transport == "listen":
            room = self._room()
            if room > 0:
                short = self.earlier or self._waiting_behind()
                wait = SHORT_POLL_SECONDS if short else LONG_POLL_SECONDS
                for m in self.api.claim(min(room, 100), wait_seconds=wait):
                    self._process(m)
                return
            self._wait_wake(0.5)
        elif (
            self.cfg.transport == "realtime"
            and self._realtime is not None
            and self._realtime.connected.is_set()
        ):
            self._wait_wake(self._watching(REALTIME_BACKSTOP_SECONDS))
        else:
            self._wait_wake(self._watching(self.cfg.poll_interval * random.uniform(0.8, 1.2)))

    def _watching(self, seconds: float) -> float:
        """How long the loop may wait: an earlier run's COMMAND sends no SIGCHLD when it exits, so
        while one is watched the loop looks again within SHORT_POLL_SECONDS."""
        return min(seconds, SHORT_POLL_SECONDS) if self.earlier else seconds

    def _housekeep(self) -> None:
        """When due (`--keep-days`): what is old and finished leaves the state dir
        (`orchestrator.housekeeping`). SIGTERM waits for it; a failure is said and tried again later."""
        if not self.housekeeping.due():
            return
        try:
            with self._uninterrupted():
                pruned = self.housekeeping.run()
        except (OSError, sqlite3.Error, subprocess.SubprocessError, WorktreeError) as exc:
            self.log("housekeeping", f"housekeeping failed ({exc}); trying again in an hour")
            return
        for folder in pruned.conversations:
            self._waiting.pop(folder, None)
        for said in pruned.kept:
            self.log("worktree", said)
        if pruned.conversations or pruned.files or pruned.rows:
            self.log(
                "housekeeping",
                f"housekeeping: removed {len(pruned.conversations)} conversation(s), {pruned.files} "
                f"file(s) and {pruned.rows} journal row(s) finished over {self.cfg.keep_days} day(s) ago",
                conversations=len(pruned.conversations),
                files=pruned.files,
                rows=pruned.rows,
            )

    def _announce(self) -> None:
        """Tell the service what this machine has (its repositories and labels), once per run,
        before the first claim: routing sends a start about a repository to a machine that has it.
        It never holds back the claims: a service that cannot take it now is told again a minute
        later (meanwhile a start about a repository this machine lacks is given back)."""
        try:
            said = self.api.machine([r.wire() for r in self.cfg.repositories], self.cfg.labels)
        except Unreachable as exc:
            self._announce_after = time.monotonic() + ANNOUNCE_RETRY_SECONDS
            self.log("machine", f"could not tell the service what this machine has ({exc}); trying again")
            return
        self._announced = True
        if said is None:
            if self.cfg.repositories or self.cfg.labels:
                self.log("machine", "the service does not take a machine's repositories (an older version)")
        elif "error" in said:
            self.log("machine", f"the service refused this machine's repositories: {said.get('detail')}")
        else:
            self.log(
                "machine", f"told the service: {told(said.get('repositories', []), said.get('labels', []))}"
            )

    def drain(self) -> None:
        """Claim until empty (or until the machine has as much waiting here as it can start)."""
        while not self.stopping:
            self._tend()
            room = self._room()
            if room <= 0:
                return
            batch = self.api.claim(min(room, 100))
            if not batch:
                return
            for m in batch:
                if self.stopping:
                    return
                self._process(m)
            self._tend()

    def _tend(self) -> None:
        """Reap the COMMANDs that ended, then start the next message of each conversation that has
        one waiting and no COMMAND running, while --max-parallel allows."""
        self._reap()
        if self.stopping:
            return
        for folder, conv in list(self._waiting.items()):
            if len(self.running) >= self.cfg.max_parallel:
                return
            if self._busy(conv):
                continue
            waiting = self.conversations.pending(conv)
            if not waiting:
                del self._waiting[folder]
                continue
            entry = self.journal.get(message_id(waiting[0]))
            if entry is None or entry.state != "inboxed":  # (inboxed: not acked yet, never started)
                self._start_next(conv, waiting[0])

    def _waiting_behind(self) -> bool:
        """Whether a message waits for its conversation's running COMMAND to exit."""
        return any(self._busy(c) and self.conversations.pending(c) for c in self._waiting.values())

    def _room(self) -> int:
        """How many messages to claim now. Messages of a conversation whose COMMAND runs go to its
        inbox whatever the load; the rest wait here for a slot, at most --max-parallel of them
        beyond the slots themselves (more stays on the service, which may give it to the user's
        other machine)."""
        waiting = sum(len(self.conversations.pending(c)) for c in self._waiting.values() if not self._busy(c))
        return 2 * self.cfg.max_parallel - len(self.running) - waiting

    # --- one message -------------------------------------------------------------------------
    def _process(self, m: dict[str, Any]) -> None:
        """Journal, hand over, ack: SIGTERM never interrupts this, it waits for the end of it."""
        with self._uninterrupted():
            self._process_inner(m)

    def _process_inner(self, m: dict[str, Any]) -> None:
        if not is_uuid(m.get("messageId")):
            # The id names files in the state dir: anything but a UUID (a path, a NUL byte) is
            # refused before it is written anywhere or started; the loop goes on.
            self.log(
                "refused", f"refused a message whose messageId is not a UUID: {m.get('messageId')!r:.80}"
            )
            return
        name = _name(m)
        seen = self.journal.get(m["messageId"])
        self.log(
            "claimed",
            f"claimed {name} (attempt {m['attempt']})",
            messageId=m["messageId"],
            queueId=m["queueId"],
            attempt=m["attempt"],
        )
        if seen is not None and seen.state in ("inboxed", "delivered", "started", "starting"):
            # Handed over before (the ack was lost, or a newer claim of it came): ack this claim,
            # never hand it over twice. (An `inboxed` one gets its `delivered` here.)
            if self._ack(m, name) == "acked" and seen.state == "inboxed":
                self.journal.mark(m["messageId"], "delivered")
            self.log(
                "duplicate", f"{name} was already handed over here; acked again", messageId=m["messageId"]
            )
            return
        missing = self._missing(m) if m.get("kind") == "start" else None
        if missing is not None:
            self._give_back(m, name, missing)
            return
        self.journal.record(m)
        self._hand_over(m, name)

    def _missing(self, m: dict[str, Any]) -> str | None:
        """The repository a message names that this machine has no checkout of (`host/owner/name`),
        or None."""
        repository = m.get("repository")
        if not isinstance(repository, dict) or not repository.get("fullName"):
            return None
        key = repository_key(str(repository.get("hostname") or ""), str(repository["fullName"]))
        return None if key in self._repos else key

    def _give_back(self, m: dict[str, Any], name: str, key: str) -> None:
        """A start about a repository this machine does not have (its --repo list changed since
        the service routed it): released with the reason, and the service routes it again."""
        reason = f"{REPOSITORY_MISSING}: this machine has no checkout of {key}"
        while True:
            try:
                status = self.api.release(m["queueId"], m["claimToken"], reason)
                self._came_back()
                break
            except Unreachable as exc:
                self._went_away(str(exc))
                if self.stopping:
                    return  # unacked: its lease ends, and it comes back here to be given back again
                time.sleep(self._next_backoff())
        self.log(
            "gave_back", f"{name}: no checkout of {key} here; given back ({status})", messageId=m["messageId"]
        )

    def _hand_over(self, m: dict[str, Any], name: str) -> None:
        """A journaled message: a stop is acked, then acted on; any other goes into its
        conversation's inbox, then is acked (SIGKILLed between the two, the next run finds it
        written and acks it: `_resume`)."""
        mid = m["messageId"]
        if m.get("kind") == "stop":
            if self._settle(m, name, self._ack(m, name)) and not self.stopping:
                self._stop(m, name)
            return
        conv = self.conversations.of(conversation_key(m))
        self.conversations.put(conv, m)
        self._waiting[conv.folder] = conv
        self.journal.mark(mid, "inboxed")
        result = self._ack(m, name)
        if result == "not_found":
            self.conversations.retract(conv, mid)  # cancelled before anyone read it
        if self._settle(m, name, result):
            self.journal.mark(mid, "delivered")
            self.conversations.append(conv, message_entry(m))
            if self._busy(conv):
                self.log("inbox", f"{name}: in the inbox of the running agent", messageId=mid)

    def _settle(self, m: dict[str, Any], name: str, result: str) -> bool:
        """What an ack's answer means for the journal; True when it was acked."""
        if result == "acked":
            return True
        if result == "abandoned":
            self.log("abandoned", f"{name}: stopping while the service is away; acks on next run")
        elif result == "claim_superseded":
            # A newer claim of it will come. One already in the inbox stays there, unstarted, and
            # stays `inboxed` in the journal: that claim finds it so and only acks.
            if m.get("kind") == "stop":
                self.journal.forget(m["messageId"])
            self.log(
                "superseded",
                f"{name}: a newer claim owns it; its delivery is acked instead",
                messageId=m["messageId"],
            )
        else:
            self.journal.forget(m["messageId"])
            self.log("gone", f"{name}: cancelled or expired on the server; dropped", messageId=m["messageId"])
        return False

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

    # --- starting COMMAND ----------------------------------------------------------------------
    def _start_next(self, conv: Conversation, path: Path) -> None:
        """Start COMMAND with the conversation's oldest waiting message (the launcher takes it out
        of the inbox): at most one COMMAND per conversation runs."""
        try:
            m = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # (read and removed by an agent meanwhile)
        mid = m["messageId"]
        name = _name(m)
        self.journal.mark(mid, "starting")
        repo = self.workplace.repository(conv, m)
        try:
            workdir = self.workplace.directory(conv, repo, m)
        except WorktreeError as exc:
            self.journal.mark(mid, "delivered")
            self.log("error", f"could not make the worktree for {name}: {exc}", messageId=mid)
            self._post_activity(
                m, {"type": "error", "body": f"devpilot could not make a worktree: {exc}"}, f"{mid}:worktree"
            )
            path.unlink(missing_ok=True)
            return
        self._write_transcript(conv, m)
        env = self.workplace.environment(m, conv, workdir, repo)
        spec = Launch(
            marker=self._marker(mid),
            message=path,
            errors=private_dir(self.cfg.state_dir / "logs") / f"{mid}.stderr",
            taken_from_inbox=True,
            exited=private_dir(self.cfg.state_dir / "exited") / mid,
        )
        try:
            proc = launch(spec, self.cfg.command, env, workdir)
        except OSError as exc:
            self.journal.mark(mid, "delivered")
            self.log("error", f"could not start {name}: {exc}", messageId=mid)
            return
        self.journal.mark(mid, "started")
        self.running[mid] = Running(proc, m, conv, name)
        self.log("started", f"started {name} (pid {proc.pid})", messageId=mid, pid=proc.pid)

    def _write_transcript(self, conv: Conversation, m: dict[str, Any]) -> None:
        """The conversation so far, before its COMMAND starts: every message this machine had,
        and every activity of the agent session as the service has them (kept from the last
        transcript when the service cannot be asked now)."""
        key = conversation_key(m)
        messages = [e.message for e in self.journal.in_conversation(key)]
        activities: list[dict[str, Any]] | None = []
        agent = speaks_in(m)
        if agent:
            try:
                activities = self.api.activities(agent)
            except (Unreachable, Rejected) as exc:
                self.log("transcript", f"activities not read ({exc}); the transcript keeps the last ones")
                activities = None
        self.conversations.write_transcript(conv, messages, activities)

    def _resume(self) -> None:
        """After a crash: finish what the journal shows was interrupted (see orchestrator/journal.py)."""
        with self._uninterrupted():
            for entry in self.journal.unfinished():
                if self.stopping:
                    return
                m = entry.message
                name = _name(m)
                mid = entry.message_id
                if entry.state == "journaled":
                    self.log("resume", f"resuming {name}: taken before the last stop, maybe not acked")
                    self._hand_over(m, name)
                elif entry.state == "inboxed":
                    self._settle(m, name, result := self._ack(m, name))
                    if result == "acked":
                        self.journal.mark(mid, "delivered")
                    elif result == "not_found":
                        self.conversations.retract(self.conversations.of(conversation_key(m)), mid)
                elif entry.state == "acked":  # (a journal from before the inbox)
                    conv = self.conversations.of(conversation_key(m))
                    self.conversations.put(conv, m)
                    self._waiting[conv.folder] = conv
                    self.journal.mark(mid, "delivered")
                elif entry.state == "starting":
                    if self._marker(mid).exists():  # the launcher ran before the crash
                        self.journal.mark(mid, "started")
                        self.log(
                            "duplicate", f"{name} was already started before the last stop", messageId=mid
                        )
                    else:  # still in the inbox (or read by its agent): the loop starts it if due
                        self.journal.mark(mid, "delivered")

    def _find_earlier(self) -> None:
        """At start-up, once: the COMMANDs an earlier run started that still run are watched."""
        for a in self.journal.ages():
            mid = a.message_id
            if a.state in ("starting", "started") and mid not in self.running:
                pid = commands.running_pid(self._marker(mid), mid)
                entry = self.journal.get(mid) if pid else None
                if entry is not None:
                    self._watch(pid, entry.message)

    def _reap(self) -> None:
        """Each COMMAND that ended: forgotten as running and its last word said, SIGTERM waiting
        for both (a SIGTERM between them would leave the last word unsaid, and the next run,
        finding the COMMAND gone, would not say it either: Linear would wait on the session)."""
        for mid, run in list(self.running.items()):
            with self._uninterrupted():
                code = run.proc.poll()
                if code is None:
                    continue
                del self.running[mid]
                self.log(
                    "finished", f"{run.name} finished with exit code {code}", messageId=mid, exitCode=code
                )
                if mid in self.stopped:
                    self.stopped.discard(mid)
                    continue
                self._after_exit(run.message, run.conv, code)
        for mid, earlier in list(self.earlier.items()):
            with self._uninterrupted():  # (as above, for a COMMAND an earlier run started)
                if commands.running_pid(self._marker(mid), mid):
                    continue
                del self.earlier[mid]
                code = commands.exit_code(self.cfg.state_dir / "exited" / mid)
                self.log(
                    "finished",
                    f"{earlier.name} (started before the orchestrator restarted) finished with exit code "
                    f"{'unknown' if code is None else code}",
                    messageId=mid,
                    exitCode=code,
                )
                if mid in self.stopped:
                    self.stopped.discard(mid)
                    continue
                self._after_exit(earlier.message, earlier.conv, code)

    # --- conversations -----------------------------------------------------------------------
    def _after_exit(self, m: dict[str, Any], conv: Conversation, code: int | None) -> None:
        """COMMAND ended. Linear completes a session on a `response` and shows an `error`: when
        COMMAND did not say its own last word, the orchestrator says it (with a stable id: said
        once, even if repeated), unless COMMAND asked the person something (an elicitation: the
        answer comes as a follow-up) or follow-ups it never read are waiting (the next COMMAND
        takes them). A conversation whose last word is said is over: its worktree goes. `code` is
        None when nothing recorded it (an earlier run's COMMAND whose launcher was killed)."""
        mid = m["messageId"]
        last = self._said(mid)
        waiting = bool(self.conversations.pending(conv))
        if speaks_in(m) and last not in FINAL:
            if code != 0:
                tail = commands.tail(self.cfg.state_dir / "logs" / f"{mid}.stderr")
                how = (
                    "The agent ended, but its exit code is unknown: it was started before the "
                    "orchestrator restarted, and its launcher did not record how it ended."
                    if code is None
                    else f"The agent exited with code {code}."
                )
                self._post_activity(m, {"type": "error", "body": f"{how}{tail}"}, f"{mid}:exit")
                last = "error"
            elif last != "elicitation" and not waiting:
                self._post_activity(m, {"type": "response", "body": "Finished."}, f"{mid}:exit")
                last = "response"
        if (last in FINAL or not m.get("agentSessionId")) and not waiting:
            self._end(conv)

    def _said(self, mid: str) -> str | None:
        """The type of the last activity COMMAND posted with `devpilot-orchestrator activity`."""
        try:
            return (self.cfg.state_dir / "responded" / mid).read_text().strip() or "response"
        except OSError:
            return None

    def _end(self, conv: Conversation) -> None:
        """The conversation is over: its worktree (if any) is removed unless work is uncommitted."""
        said = self.workplace.end(conv)
        if said:
            self.log("worktree", said)

    def _busy(self, conv: Conversation) -> bool:
        """Whether a COMMAND of this conversation runs: one this process started, or one an
        earlier run started (found by its marker's pid, checked to still be that message's). One
        that ended counts until `_reap` has said its last word."""
        if any(r.conv.folder == conv.folder for r in self.running.values()):
            return True
        if any(e.conv.folder == conv.folder for e in self.earlier.values()):
            return True
        return bool(self._earlier_processes(conv.key))

    def _earlier_processes(self, key: str) -> list[int]:
        """The pids of the conversation's COMMANDs an earlier run started that still run; each is
        watched from now on (`_reap` reports its exit)."""
        pids = []
        for entry in self.journal.started_in(key):
            mid = entry.message_id
            if mid in self.running:
                continue
            pid = commands.running_pid(self._marker(mid), mid)
            if pid:
                pids.append(pid)
                self._watch(pid, entry.message)
        return pids

    def _watch(self, pid: int, m: dict[str, Any]) -> None:
        if m["messageId"] not in self.earlier:
            conv = self.conversations.of(conversation_key(m))
            self.earlier[m["messageId"]] = Earlier(pid, m, conv, _name(m))
            self.log("watching", f"{_name(m)} runs, started before the orchestrator restarted (pid {pid})")

    def _post_activity(self, m: dict[str, Any], content: dict[str, Any], key: str) -> None:
        agent_session_id = speaks_in(m)
        if not agent_session_id:
            return
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
                # SIGTERM waits for a last word (`_reap`), but not through the backoffs of a service
                # that is away: stopping, this was the last try; and a SIGTERM ends the pause.
                if attempt == 2 or self.stopping:
                    break
                self._pause(self._next_backoff())
        self.log("activity", f"could not post a {content['type']} for agent session {agent_session_id}")

    def _stop(self, m: dict[str, Any], name: str) -> None:
        """Linear's stop: end every process this machine runs for the conversation (SIGTERM to its
        process group, then SIGKILL after the grace period), drop the follow-ups nobody read, post
        the final response, and end the conversation (its worktree goes)."""
        mid = m["messageId"]
        conv = self.conversations.of(conversation_key(m))
        self.journal.mark(mid, "starting")
        groups = [
            r.proc.pid
            for r in self.running.values()
            if r.conv.folder == conv.folder and r.proc.poll() is None
        ]
        self.stopped.update(k for k, r in self.running.items() if r.conv.folder == conv.folder)
        groups += self._earlier_processes(conv.key)
        self.stopped.update(k for k, e in self.earlier.items() if e.conv.folder == conv.folder)
        commands.end_groups(groups, self.cfg.stop_grace, self._alive)
        dropped = self.conversations.clear(conv)
        self._post_activity(m, {"type": "response", "body": "Stopped, as asked in Linear."}, f"{mid}:stop")
        fd = os.open(self._marker(mid), os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
        self.journal.mark(mid, "started")
        self._reap()
        self._end(conv)
        self.log(
            "stopped",
            f"{name}: stopped agent session {conv.key} ({len(groups)} process group(s), "
            f"{dropped} unread follow-up(s) dropped)",
            messageId=mid,
        )

    def _alive(self, pid: int) -> bool:
        for r in self.running.values():
            if r.proc.pid == pid:
                return r.proc.poll() is None
        return commands.alive(pid)

    # --- waiting and connectivity -----------------------------------------------------------
    def _wait_wake(self, seconds: float) -> None:
        """Wait `seconds`, or until woken (a COMMAND exited, a realtime event, a signal), then
        forget the wake-up: the cycle about to run handles whatever woke it. (Never waiting without
        forgetting: one COMMAND's exit would leave it set, and every later wait, a backoff included,
        would return at once, in a loop that spins.)"""
        self._wake.wait(seconds)
        self._wake.clear()

    def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, cut short only by SIGTERM (`stopping`), in the middle of a cycle. (Not
        the wake-up: one set before, by the COMMAND whose exit is being reaped, would end every
        pause at once; and what it says is for the loop, which still sees it afterwards.)"""
        end = time.monotonic() + seconds
        while not self.stopping and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

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
