"""The orchestrator's loop: on every wake-up, claim until the queue is empty, taking each message,
and start COMMAND for each conversation's next message when none of its runs; then wait as the
transport says. It stops on SIGTERM or SIGINT having started nothing new, and with exit 3 when the
service refuses its token.

Each room of it does one job, and its arrows run one way, down this list: the loop wires them and
runs the cycle; `handover` takes each claimed message (journal, inbox, ack; or gives it back);
`transports` waits between two drains; `scheduler` decides when each conversation's next COMMAND
starts, and ends a conversation (its last COMMAND reaped, or Linear's stop); `starter` starts one;
`processes` knows which run, this run's and an earlier run's; `last_word` is what the orchestrator
says itself in an agent session; `announce` tells the service what this machine has; `backoff`
paces the tries while the service is away; `signals` is what wakes the loop and what stops it.
"""

from __future__ import annotations

import sqlite3
import subprocess

from orchestrator.announce import Announcement
from orchestrator.backoff import Backoff
from orchestrator.client import Api, Rejected, Unreachable
from orchestrator.config import Config
from orchestrator.conversations import Conversations
from orchestrator.handover import Handover
from orchestrator.housekeeping import Housekeeping
from orchestrator.journal import Journal
from orchestrator.last_word import LastWord
from orchestrator.log import Log
from orchestrator.processes import Processes
from orchestrator.scheduler import Scheduler
from orchestrator.signals import Shutdown, Signals
from orchestrator.starter import Starter
from orchestrator.state import private_dir
from orchestrator.transports import Transport
from orchestrator.workplace import Workplace
from orchestrator.worktrees import WorktreeError


class Orchestrator:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.log = Log(cfg.json_logs)
        self.signals = Signals()
        self.api = Api(cfg.url, cfg.token, endpoints=cfg.endpoints)
        self.journal = Journal(private_dir(cfg.state_dir) / "journal.sqlite3")
        self.conversations = Conversations(cfg.state_dir)
        self.workplace = Workplace(
            token=cfg.token,
            state_dir=cfg.state_dir,
            workdir=cfg.workdir,
            worktree=cfg.worktree,
            repositories=cfg.repositories,
            pass_env=cfg.pass_env,
            endpoints=self.api.endpoints,
        )
        self.backoff = Backoff(self.log, self.signals)
        self.processes = Processes(cfg.state_dir, self.journal, self.conversations, self.log, self.signals)
        last_word = LastWord(self.api, self.log, self.signals, self.backoff, cfg.state_dir)
        starter = Starter(
            cfg,
            self.api,
            self.journal,
            self.conversations,
            self.workplace,
            self.processes,
            last_word,
            self.log,
        )
        self.scheduler = Scheduler(
            cfg,
            self.journal,
            self.conversations,
            self.workplace,
            self.processes,
            starter,
            last_word,
            self.log,
            self.signals,
        )
        self.handover = Handover(
            {r.key for r in cfg.repositories},
            self.api,
            self.journal,
            self.conversations,
            self.processes,
            self.scheduler,
            self.backoff,
            self.log,
            self.signals,
        )
        self.transport = Transport(cfg.transport, cfg.poll_interval, self.api, self.log, self.signals)
        self.announcement = Announcement(self.api, cfg.repositories, cfg.labels, self.log)
        self.housekeeping = Housekeeping(
            cfg.state_dir,
            cfg.keep_days,
            self.journal,
            self.conversations,
            self.workplace,
            self.processes.messages,
        )

    def run(self) -> int:
        self.signals.install()
        self.log(
            "start",
            f"orchestrator up: {self.cfg.url or 'endpoints ' + self.api.endpoints['claim']} via "
            f"{self.cfg.transport}, state in {self.cfg.state_dir}",
        )
        try:
            self.processes.find_earlier()  # (first: housekeeping must know every COMMAND that runs)
            self._housekeep()
            self.handover.resume()
            self.transport.start()
            while not self.signals.stopping:
                try:
                    self._cycle()
                    self.backoff.came_back()
                except Unreachable as exc:
                    self.backoff.went_away(str(exc))
                    self.signals.wait(self.backoff.next())
        except Shutdown:
            pass
        except Rejected as exc:
            self.log("rejected", f"token rejected by the service: {exc}")
            return 3
        finally:
            self.signals.closing = True
            self.transport.stop()
            self.journal.close()
            self.api.close()
        self.log("stop", "stopped: nothing new started")
        return 0

    def _cycle(self) -> None:
        self._housekeep()
        if self.announcement.due():
            self.announcement.tell()
        self.scheduler.tend()
        self.drain()
        if self.signals.stopping:
            return
        for m in self.transport.wait(self.scheduler):
            self.handover.take(m)

    def drain(self) -> None:
        """Claim until empty (or until the machine has as much waiting here as it can start)."""
        while not self.signals.stopping:
            self.scheduler.tend()
            room = self.scheduler.room()
            if room <= 0:
                return
            batch = self.api.claim(min(room, 100))
            if not batch:
                return
            for m in batch:
                if self.signals.stopping:
                    return
                self.handover.take(m)
            self.scheduler.tend()

    def _housekeep(self) -> None:
        """When due (`--keep-days`): what is old and finished leaves the state dir
        (`orchestrator.housekeeping`). SIGTERM waits for it; a failure is said and tried again later."""
        if not self.housekeeping.due():
            return
        try:
            with self.signals.uninterrupted():
                pruned = self.housekeeping.run()
        except (OSError, sqlite3.Error, subprocess.SubprocessError, WorktreeError) as exc:
            self.log("housekeeping", f"housekeeping failed ({exc}); trying again in an hour")
            return
        for folder in pruned.conversations:
            self.scheduler.forget(folder)
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
