"""Telling the service what this machine has (`POST /machine`: its `--repo` and `--label`), once per
run, before the first claim: routing sends a start about a repository to a machine that has it.
It never holds back the claims: a service that cannot take it now is told again a minute later
(meanwhile a start about a repository this machine lacks is given back)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from orchestrator.client import Api, Unreachable
from orchestrator.log import Log
from orchestrator.repositories import LocalRepo, told

RETRY_SECONDS = 60.0  # between tries to tell the service what this machine has


@dataclass
class Announcement:
    api: Api
    repositories: list[LocalRepo]
    labels: list[str]
    log: Log
    _told: bool = field(default=False, init=False)  # the service has heard it
    _after: float = field(default=0.0, init=False)  # (monotonic) when to try telling it again

    def due(self) -> bool:
        return not self._told and time.monotonic() >= self._after

    def tell(self) -> None:
        try:
            said = self.api.machine([r.wire() for r in self.repositories], self.labels)
        except Unreachable as exc:
            self._after = time.monotonic() + RETRY_SECONDS
            self.log("machine", f"could not tell the service what this machine has ({exc}); trying again")
            return
        self._told = True
        if said is None:
            if self.repositories or self.labels:
                self.log("machine", "the service does not take a machine's repositories (an older version)")
        elif "error" in said:
            self.log("machine", f"the service refused this machine's repositories: {said.get('detail')}")
        else:
            self.log(
                "machine", f"told the service: {told(said.get('repositories', []), said.get('labels', []))}"
            )
