"""The service layer: what every entry point (HTTP handlers, the scheduled sweep, `devpilot serve`)
calls. Each operation owns its transaction and what happens after the commit: the Linear notices
its transaction wrote are posted right after, off the caller's path, so an agent session hears back
within Linear's 10 s. If the process dies first they are still in the table, and the sweep sends
them. Handlers only parse, call one method here, and answer.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from uuid import UUID

from shared import intake, notices, orchestrators, queue
from shared.db import Pool
from shared.linear import Webhook
from shared.models import TaskDispatchMessage
from shared.settings import Settings
from shared.wakeups import Wakeups

log = logging.getLogger("devpilot.dispatch")

RECHECK_SECONDS = 5.0  # the polling backstop inside a long-poll, should a NOTIFY be lost


class Dispatch:
    def __init__(self, pool: Pool, settings: Settings, wakeups: Wakeups | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.wakeups = wakeups
        self._sender = ThreadPoolExecutor(max_workers=2, thread_name_prefix="devpilot-notices")

    def _after_commit(self, notice_ids: list[UUID]) -> Future[notices.SendResult] | None:
        """Post the notices a committed transaction wrote, now, off the request path."""
        if not notice_ids:
            return None

        def run() -> notices.SendResult:
            try:
                return notices.send_pending(self.pool, self.settings, ids=notice_ids)
            except Exception:
                log.exception("sending notices failed; the sweep retries")
                return notices.SendResult(0, len(notice_ids))

        return self._sender.submit(run)

    def receive_webhook(self, hook: Webhook, delivery_key: str) -> dict[str, object]:
        """One verified, fresh Linear webhook: its one intake transaction, then its notices."""
        received = intake.receive(self.pool, hook, delivery_key)
        self._after_commit(received.notice_ids)
        return received.answer

    def claim(self, orchestrator_id: UUID, *, max: int, wait_seconds: float = 0) -> list[TaskDispatchMessage]:
        """The poll route's work. With `wait_seconds` it long-polls: it registers for this
        orchestrator's wake-ups on the instance's single LISTEN connection before looking at the
        table (so a NOTIFY between the look and the wait is kept), and looks again at least every
        RECHECK_SECONDS whatever happens, so a lost NOTIFY costs latency, never a message."""
        orchestrators.touch(self.pool, orchestrator_id)

        def take() -> list[TaskDispatchMessage]:
            return queue.claim(self.pool, orchestrator_id, max=max, lease_seconds=self.settings.lease_seconds)

        if wait_seconds <= 0 or self.wakeups is None:
            return take()
        deadline = time.monotonic() + wait_seconds
        with self.wakeups.waiter(str(orchestrator_id)) as woken:
            self.wakeups.wait_until_listening(timeout=min(2.0, wait_seconds))
            messages = take()
            while not messages:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                woken.wait(min(left, RECHECK_SECONDS))
                woken.clear()
                messages = take()
        return messages

    def ack(self, orchestrator_id: UUID, items: list[queue.AckItem]) -> list[queue.AckStatus]:
        result = queue.ack_many(self.pool, orchestrator_id, items)
        self._after_commit(result.notice_ids)
        return result.statuses

    def release(
        self, orchestrator_id: UUID, queue_id: UUID, claim_token: UUID, reason: str | None
    ) -> queue.Released:
        released = queue.release(
            self.pool, self.settings, orchestrator_id, queue_id, claim_token, reason=reason
        )
        self._after_commit(list(released.notice_ids))
        return released

    def sweep(self) -> queue.SweepResult:
        """Re-queue expired leases and dead-letter at the limit, then send every Linear notice still
        unsent (Linear was down, or an instance died between a commit and its send)."""
        result = queue.sweep(self.pool, self.settings)
        sent = notices.send_pending(self.pool, self.settings)
        if sent.sent or sent.failed:
            log.info('{"event":"notices","sent":%d,"failed":%d}', sent.sent, sent.failed)
        return result

    def close(self) -> None:
        self._sender.shutdown(wait=False)
