"""What one run of the orchestrator is told: its command line, read and checked
(`orchestrator.options`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestrator.repositories import LocalRepo
from orchestrator.state import default_state_dir

TransportName = Literal["poll", "listen", "realtime"]


@dataclass
class Config:
    url: str | None  # one base URL serving every route, or
    token: str
    command: list[str]
    transport: TransportName = "poll"
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
