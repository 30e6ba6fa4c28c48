"""Taking a claimed message: journaled, handed over to its conversation's inbox, acked (SIGTERM
waits for the whole of it); a start about a repository this machine has no checkout of is given
back instead; a stop is acked, then acted on. After a crash, what the journal shows was interrupted
is finished (`resume`). The order, and why each step survives a SIGKILL: `orchestrator.journal`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.backoff import Backoff
from orchestrator.client import Api
from orchestrator.conversations import Conversations, conversation_key, message_entry
from orchestrator.journal import Journal
from orchestrator.log import Log
from orchestrator.messages import is_uuid
from orchestrator.messages import name as _name
from orchestrator.processes import Processes
from orchestrator.scheduler import Scheduler
from orchestrator.signals import Signals
from shared.wire.messages import REPOSITORY_MISSING, repository_key


@dataclass
class Handover:
    repositories: set[str]  # the keys of this machine's --repo
    api: Api
    journal: Journal
    conversations: Conversations
    processes: Processes
    scheduler: Scheduler
    backoff: Backoff
    log: Log
    signals: Signals

    def take(self, m: dict[str, Any]) -> None:
        """Journal, hand over, ack: SIGTERM never interrupts this, it waits for the end of it."""
        with self.signals.uninterrupted():
            self._take(m)

    def resume(self) -> None:
        """After a crash: finish what the journal shows was interrupted (see orchestrator/journal.py)."""
        with self.signals.uninterrupted():
            for entry in self.journal.unfinished():
                if self.signals.stopping:
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
                    self.scheduler.may_wait(conv)
                    self.journal.mark(mid, "delivered")
                elif entry.state == "starting":
                    if self.processes.marker(mid).exists():  # the launcher ran before the crash
                        self.journal.mark(mid, "started")
                        self.log(
                            "duplicate", f"{name} was already started before the last stop", messageId=mid
                        )
                    else:  # still in the inbox (or read by its agent): the loop starts it if due
                        self.journal.mark(mid, "delivered")

    def _take(self, m: dict[str, Any]) -> None:
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
        return None if key in self.repositories else key

    def _give_back(self, m: dict[str, Any], name: str, key: str) -> None:
        """A start about a repository this machine does not have (its --repo list changed since
        the service routed it): released with the reason, and the service routes it again."""
        reason = f"{REPOSITORY_MISSING}: this machine has no checkout of {key}"
        status = self.backoff.insist(lambda: self.api.release(m["queueId"], m["claimToken"], reason))
        if status is None:
            return  # unacked: its lease ends, and it comes back here to be given back again
        self.log(
            "gave_back", f"{name}: no checkout of {key} here; given back ({status})", messageId=m["messageId"]
        )

    def _hand_over(self, m: dict[str, Any], name: str) -> None:
        """A journaled message: a stop is acked, then acted on; any other goes into its
        conversation's inbox, then is acked (SIGKILLed between the two, the next run finds it
        written and acks it: `resume`)."""
        mid = m["messageId"]
        if m.get("kind") == "stop":
            if self._settle(m, name, self._ack(m, name)) and not self.signals.stopping:
                self.scheduler.stop(m, name)
            return
        conv = self.conversations.of(conversation_key(m))
        self.conversations.put(conv, m)
        self.scheduler.may_wait(conv)
        self.journal.mark(mid, "inboxed")
        result = self._ack(m, name)
        if result == "not_found":
            self.conversations.retract(conv, mid)  # cancelled before anyone read it
        if self._settle(m, name, result):
            self.journal.mark(mid, "delivered")
            self.conversations.append(conv, message_entry(m))
            if self.processes.busy(conv):
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
        result = self.backoff.insist(lambda: self.api.ack(m["queueId"], m["claimToken"]))
        if result is None:
            return "abandoned"  # still journaled: the redelivery after restart acks it
        if result == "acked":
            self.log("acked", f"acked {name}", messageId=m["messageId"], queueId=m["queueId"])
        return result
