"""The service layer: what every entry point (HTTP handlers, the scheduled sweep, `devpilot serve`)
calls. Each operation owns its transaction and what happens after the commit: the Linear notices
its transaction wrote are posted right after, off the caller's path, so an agent session hears back
within Linear's 10 s. If the process dies first they are still in the table, and the sweep sends
them. Handlers only parse, call one method here, and answer.

It is also the one module of the service the handlers (`functions/`) import, with the wire types
(`shared.wire`): the names they use besides `Dispatch` are re-exported (`__all__`): those this
module loads anyway from its imports, the rest, grouped by what they serve, when a handler first
asks (`_LATER`). `functions/runtime.py`, which wires the pool, the settings and the embedded
database, takes those from here too. tests/unit/test_handler_imports.py holds every handler to it.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

from psycopg.types.json import Jsonb

from shared.delivery import queue
from shared.delivery.queue import NOT_FOUND, NOT_LATEST, AckItem
from shared.delivery.wakeups import Wakeups
from shared.fleet import orchestrators
from shared.fleet.orchestrators import (
    UNAUTHORIZED,
    Orchestrator,
    authenticate,
    authenticate_agent,
    hash_token,
)
from shared.plumbing import deadline
from shared.plumbing.db import Pool, Tx, open_pool, transaction
from shared.plumbing.settings import Settings, SettingsError, get_settings
from shared.plumbing.sql import query
from shared.wire.messages import REPOSITORY_MISSING, TaskDispatchMessage

if TYPE_CHECKING:  # (the webhook's modules load with the webhook route, not with every route)
    from shared.linear import auth as linear_auth
    from shared.linear.webhooks import Webhook
    from shared.operators import sessions

log = logging.getLogger("devpilot.dispatch")

RECHECK_SECONDS = 5.0  # the polling backstop inside a long-poll, should a NOTIFY be lost
# What a long-poll takes after waiting is handed over, not claimed (queue.sql `claim_handover`): its
# client may have died meanwhile. Unacked that long, it is due again, at the same attempt, for the
# machine's next claim: a machine back within seconds gets it within 10 s of its arrival.
HANDOVER_SECONDS = 4


class Refused(Exception):
    """The service will not do it; `code` is the contract's error code (the caller maps it to a status)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


class Dispatch:
    def __init__(self, pool: Pool, settings: Settings, wakeups: Wakeups | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.wakeups = wakeups
        self._sender = ThreadPoolExecutor(max_workers=2, thread_name_prefix="devpilot-notices")

    def _after_commit(self, notice_ids: list[UUID] | None) -> Future[object] | None:
        """Post the notices a committed transaction wrote (None: every one due), now, off the
        request path."""
        if notice_ids is not None and not notice_ids:
            return None

        from shared.linear import notices  # (loaded when a notice is due, not by every target's cold start)

        return self._in_background(lambda: notices.send_pending(self.pool, self.settings, ids=notice_ids))

    def _route_after_commit(self, route_ids: list[UUID]) -> Future[object] | None:
        """Route what a committed webhook left to route once Linear is asked (`shared.delivery.routing`),
        now, off the request path, so Linear hears within its 10 s."""
        if not route_ids:
            return None

        from shared.delivery import routing

        return self._in_background(lambda: routing.run(self.pool, self.settings, ids=route_ids))

    def _in_background(self, work: Callable[[], object]) -> Future[object]:
        """After-commit work on the sender's threads. What fails there is still in its table, and
        the sweep does it: a failure is logged, never raised to anyone."""

        def run() -> object:
            try:
                return work()
            except Exception:
                log.exception("after-commit work failed; the sweep retries")
                return None

        return self._sender.submit(run)

    def receive_webhook(self, hook: Webhook, delivery: str | None) -> dict[str, object]:
        """One verified, fresh Linear webhook (`delivery`: its Linear-Delivery header): its one
        intake transaction, then its notices."""
        from shared.delivery import intake

        try:
            received = intake.receive(self.pool, hook, delivery, self.settings.linear_client_id)
        except queue.MachineRevoked:
            # Every round chose a machine whose revoke committed while it waited: nothing is
            # written, and Linear's retry of the delivery is decided afresh.
            raise Refused(
                "try_again", "the machines of this user changed while the webhook was decided; retry"
            ) from None
        except queue.IssueOvertaken:
            # Every round found the issue assigned again meanwhile: nothing is written, and
            # Linear's retry of the delivery is decided afresh.
            raise Refused(
                "try_again", "the issue was assigned again while the webhook was decided; retry"
            ) from None
        self._after_commit(received.notice_ids)
        self._route_after_commit(received.route_ids)
        return received.answer

    def claim(
        self,
        orchestrator_id: UUID,
        *,
        max: int,
        wait_seconds: float = 0,
        token_hash: bytes | None = None,
    ) -> list[TaskDispatchMessage]:
        """The poll route's work. With `wait_seconds` it long-polls: it registers for this
        orchestrator's wake-ups on the instance's single LISTEN connection before looking at the
        table (so a NOTIFY between the look and the wait is kept), marks the machine as listening
        (enqueues to a machine nobody waits on send no NOTIFY), and looks again at least every
        RECHECK_SECONDS whatever happens, so a lost NOTIFY costs latency, never a message."""

        def take(handover: int | None = None) -> list[TaskDispatchMessage]:
            return queue.claim(
                self.pool,
                orchestrator_id,
                max=max,
                lease_seconds=self.settings.lease_seconds,
                handover_seconds=handover,
            )

        if wait_seconds <= 0 or self.wakeups is None:
            return take()
        ends = time.monotonic() + wait_seconds
        # The request's database deadline, moved on by the wait: a claim made at the end of the
        # wait has as long as a plain poll's.
        with deadline.extended(wait_seconds), self.wakeups.waiter(str(orchestrator_id)) as woken:
            self.wakeups.wait_until_listening(timeout=min(2.0, wait_seconds))
            # Enqueues NOTIFY only a machine that says it is waiting; said before the first look.
            orchestrators.mark_listening(self.pool, orchestrator_id, wait_seconds, RECHECK_SECONDS)
            messages = take()
            while not messages:
                left = ends - time.monotonic()
                if left <= 0:
                    break
                woken.wait(min(left, RECHECK_SECONDS))
                woken.clear()
                if not orchestrators.is_active(self.pool, orchestrator_id, token_hash):
                    # Revoked while this long-poll waited (the revoke wakes it), or its owner logged
                    # in again (a new token): it ends, having taken nothing.
                    raise Refused("unauthorized", "this orchestrator was revoked, or its token replaced")
                messages = take(HANDOVER_SECONDS)
        return messages

    def poll(self, token: str, *, max: int) -> tuple[Orchestrator, list[TaskDispatchMessage]]:
        """A plain poll (no wait) in one statement: who is calling, that it was seen, and its claim.
        Refused when the token is no active machine's; nothing is claimed then."""
        polled = queue.poll(
            self.pool, orchestrators.hash_token(token), max=max, lease_seconds=self.settings.lease_seconds
        )
        if polled is None:
            raise Refused("unauthorized", orchestrators.UNAUTHORIZED)
        return polled

    def ack(self, token: str, items: list[queue.AckItem]) -> tuple[Orchestrator, queue.AckResult]:
        """The ack route: who is calling, that it was seen, and its acks (each one's status and
        what it is told), in one statement. Refused when the token is no active machine's; nothing
        is acked then."""
        acked = queue.ack_as(self.pool, orchestrators.hash_token(token), items, self.settings.public_url)
        if acked is None:
            raise Refused("unauthorized", orchestrators.UNAUTHORIZED)
        caller, result = acked
        self._after_commit(result.notice_ids)
        return caller, result

    def release(
        self, orchestrator_id: UUID, queue_id: UUID, claim_token: UUID, reason: str | None
    ) -> queue.Released:
        """End a claim now. A start given back because the machine does not have the repository it
        names (reason `repository_missing…`) is routed again, after the commit; any other release is
        a failed attempt, retried after the backoff."""
        if reason is not None and reason.startswith(REPOSITORY_MISSING):
            from shared.delivery import routing

            again = routing.release_elsewhere(self.pool, orchestrator_id, queue_id, claim_token, reason)
            if again is not None:
                self._route_after_commit(again[1])
                return again[0]
        released = queue.release(
            self.pool, self.settings, orchestrator_id, queue_id, claim_token, reason=reason
        )
        self._after_commit(list(released.notice_ids))
        return released

    def sweep(self) -> queue.SweepResult:
        """Re-queue expired leases and dead-letter at the limit, then send every Linear notice still
        unsent (Linear was down, or an instance died between a commit and its send), and forget
        webhook deliveries and finished conversations past their retention."""
        from shared.delivery import intake, routing
        from shared.fleet import enroll
        from shared.linear import notices
        from shared.operators import retention

        # The sweep's deadline is its own (DEVPILOT_SWEEP_DEADLINE_SECONDS), for each of its
        # database steps, whether a scheduler's request or `devpilot serve`'s timer runs it. The
        # posts to Linear between them are bounded by Linear's own timeout, so the notices' and the
        # router's database blocks each get that deadline afresh (None: the pool's default, the
        # same figure).
        within = self.settings.sweep_deadline_seconds
        with deadline.bound(within):
            result = queue.sweep(self.pool, self.settings)
        with deadline.bound(None):
            routed = routing.run(self.pool, self.settings)
        if routed.routed or routed.retried:
            log.info('{"event":"routing","routed":%d,"retried":%d}', routed.routed, routed.retried)
        with deadline.bound(None):
            sent = notices.send_pending(self.pool, self.settings)
        if sent.sent or sent.failed:
            log.info('{"event":"notices","sent":%d,"failed":%d}', sent.sent, sent.failed)
        with deadline.bound(within):
            pruned = intake.prune_deliveries(self.pool, self.settings)
        if pruned:
            log.info('{"event":"deliveries_pruned","count":%d}', pruned)
        kept = retention.forget(self.pool, self.settings)  # (each batch: the sweep's deadline)
        if kept.conversations:
            log.info(
                '{"event":"conversations_forgotten","conversations":%d,"sessions":%d,"posts":%d}',
                kept.conversations,
                kept.sessions,
                kept.posts,
            )
        forgotten = enroll.forget_stale(self.pool)
        if forgotten.enrollments or forgotten.flows:
            log.info(
                '{"event":"enrollments_forgotten","enrollments":%d,"flows":%d}',
                forgotten.enrollments,
                forgotten.flows,
            )
        return result

    def _speaks_in(self, tx: Tx, orch: Orchestrator, agent_session_id: str) -> str:
        """In the caller's transaction: where this machine's post to `agent_session_id` goes, or
        Refused. Only the machine an agent session's message was delivered to may speak in it;
        anyone else learns nothing (not_found). A plain assignment's machine names its conversation
        `devpilot:<sessionId>` (the message carries no agent session): that is the agent session
        the service opened for it once Linear has answered, the alias until then."""
        from shared.linear import actions as linear_actions

        params: dict[str, object] = {
            "org_id": orch.org_id,
            "orchestrator_id": orch.id,
            "agent_session_id": agent_session_id,
            "alias_of": None,
        }
        if linear_actions.is_alias(agent_session_id):
            try:
                session_id = UUID(agent_session_id.removeprefix(linear_actions.ALIAS_PREFIX))
            except ValueError:
                raise Refused("not_found", "no agent session of yours by that id") from None
            row = tx.one(query("alias_session"), {**params, "session_id": session_id})
            if row is None:
                raise Refused("not_found", "no agent session of yours by that id")
            if row["agent_session_id"] is None and not row["opening"]:
                raise Refused(
                    "linear_not_connected",
                    "this workspace has not installed the Linear app, so this assignment has no agent session",
                )
            params["agent_session_id"] = row["agent_session_id"] or agent_session_id
            params["alias_of"] = session_id
        rights = tx.one(query("activity_rights"), params)
        assert rights is not None
        if not rights["holds"]:
            raise Refused("not_found", "no agent session of yours by that id")
        if not rights["connected"]:
            raise Refused("linear_not_connected", "this workspace has not connected Linear")
        return str(params["agent_session_id"])

    def accept_activity(
        self,
        orch: Orchestrator,
        agent_session_id: str,
        content: dict[str, Any],
        *,
        activity_id: UUID | None,
        ephemeral: bool,
        signal: str | None = None,
        signal_metadata: dict[str, Any] | None = None,
    ) -> UUID:
        """The agent's reply to Linear, into the outbox in one transaction; posted after commit with
        the activity id as Linear's `input.id` (`_speaks_in` says who may, and where it goes)."""
        aid = activity_id or uuid4()
        params = {
            "id": aid,
            "org_id": orch.org_id,
            "alias": agent_session_id,
            "orchestrator_id": orch.id,
            "body": str(content.get("body") or content.get("action") or ""),
            "content": Jsonb(content),
            "ephemeral": ephemeral,
            "signal": signal,
            "signal_metadata": Jsonb(signal_metadata) if signal_metadata is not None else None,
        }
        from shared.linear import notices

        with transaction(self.pool) as tx:
            params["agent_session_id"] = self._speaks_in(tx, orch, agent_session_id)
            if not notices.accept_activity(tx, params):
                raise Refused("not_found", "no agent session of yours by that id")
        self._after_commit([aid])
        return aid

    def accept_plan(self, orch: Orchestrator, agent_session_id: str, plan: list[dict[str, str]]) -> UUID:
        """The agent's plan, into the outbox in one transaction (who may post: as an activity);
        posted after commit as Linear's agentSessionUpdate(plan), after the plans before it."""
        params = {
            "org_id": orch.org_id,
            "orchestrator_id": orch.id,
            "body": "; ".join(f"{s['content']} ({s['status']})" for s in plan)[:2000],
            "content": Jsonb({"plan": plan}),
        }
        from shared.linear import notices

        with transaction(self.pool) as tx:
            params["agent_session_id"] = self._speaks_in(tx, orch, agent_session_id)
            plan_id = notices.accept_plan(tx, params)
        self._after_commit([plan_id])
        return plan_id

    def activities_of(self, orch: Orchestrator, agent_session_id: str) -> list[dict[str, Any]]:
        """An agent session's activities, in order (the machine's transcript of the conversation):
        only for the machine that holds it, as posting is."""
        with transaction(self.pool) as tx:
            try:
                target = self._speaks_in(tx, orch, agent_session_id)
            except Refused as exc:
                if exc.code != "linear_not_connected":
                    raise
                return []
            params = {"org_id": orch.org_id, "agent_session_id": target, "alias": agent_session_id}
            return [dict(r) for r in tx.all(query("activity_list"), params)]

    def act_on_session(
        self, session_id: UUID, action: str, actor: str, target: UUID | None = None
    ) -> sessions.Acted:
        """An operator's retry, cancel or move (`shared.operators.sessions`): one transaction, recorded with
        who did it; then what Linear hears is posted. Raises sessions.NotAllowed / NotFound."""
        from shared.operators import sessions

        if action == "retry":
            acted = sessions.retry(self.pool, session_id, actor)
        elif action == "cancel":
            acted = sessions.cancel(self.pool, session_id, actor)
        elif action == "move" and target is not None:
            acted = sessions.move(self.pool, session_id, target, actor)
        else:
            raise ValueError(f"no such action: {action}")
        self._after_commit(acted.notice_ids)
        return acted

    def revoke(self, orchestrator_id: UUID) -> queue.Revoked | None:
        """A machine revoked, its work moved or cancelled (`shared.delivery.queue.revoke`); then what Linear
        hears is posted."""
        revoked = queue.revoke(self.pool, orchestrator_id)
        if revoked is not None:
            self._after_commit(revoked.notice_ids)
        return revoked

    def connect_linear(self, code: str, state: str) -> linear_auth.Installed:
        """The OAuth callback: tokens stored in one transaction; then whatever the org's outbox held
        while it was disconnected goes out."""
        from shared.linear import auth as linear_auth

        installed = linear_auth.finish_install(self.pool, self.settings, code, state)
        self._after_commit(None)
        return installed

    def close(self) -> None:
        self._sender.shutdown(wait=False)


# --- What the handlers use besides `Dispatch` --------------------------------------------------
# Those loaded with this module anyway are imported at the top; the rest is loaded when a handler
# first asks for it (`__getattr__`), so that a route loads only what it uses
# (tests/unit/test_cold_imports.py): the modules handed over whole (a handler's
# `dispatch.linear_auth.x`), and single names with the module that has each.
_LATER_MODULES = {
    # the request's parsing and secrets
    "jsoninput": "shared.plumbing.jsoninput",
    "crypto": "shared.plumbing.crypto",
    # Linear: the webhook's checks, the OAuth install, the tokens, the notices
    "linear": "shared.linear.webhooks",
    "linear_auth": "shared.linear.auth",
    "notices": "shared.linear.notices",
    "realtime": "shared.delivery.realtime",
    # machines' own description, people and enrollment (signing in with Linear)
    "machines": "shared.fleet.machines",
    "enroll": "shared.fleet.enroll",
    "people": "shared.fleet.people",
    # operators: session pages and actions, the dashboard's sign-in
    "sessions": "shared.operators.sessions",
    "dashboard_signin": "shared.operators.dashboard_signin",
}
_LATER = {
    # the runtime's wiring
    "Database": "shared.plumbing.embedded",
    "resolve": "shared.plumbing.embedded",
    "Health": "shared.plumbing.health",
    "ACTIVITY_TYPE": "shared.linear.notices",
    "SignInFailed": "shared.fleet.signin",
    "is_member": "shared.fleet.signin",
    "Page": "shared.operators.sessions",
    "Snapshot": "shared.operators.status",
    "snapshot": "shared.operators.status",
    "format_age": "shared.operators.status",
    "pace_text": "shared.operators.status",
}

if TYPE_CHECKING:
    from shared.delivery import realtime
    from shared.fleet import enroll, machines, people
    from shared.fleet.signin import SignInFailed, is_member
    from shared.linear import auth as linear_auth
    from shared.linear import notices
    from shared.linear import webhooks as linear
    from shared.linear.notices import ACTIVITY_TYPE
    from shared.operators import dashboard_signin, sessions
    from shared.operators.sessions import Page
    from shared.operators.status import Snapshot, format_age, pace_text, snapshot
    from shared.plumbing import crypto, jsoninput
    from shared.plumbing.embedded import Database, resolve
    from shared.plumbing.health import Health
else:

    def __getattr__(name: str) -> object:
        if name in _LATER_MODULES:
            return importlib.import_module(_LATER_MODULES[name])
        where = _LATER.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where), name)


# What a handler may import from here (the service's own names, and the re-exported ones).
__all__ = [
    "ACTIVITY_TYPE",
    "HANDOVER_SECONDS",
    "NOT_FOUND",
    "NOT_LATEST",
    "RECHECK_SECONDS",
    "UNAUTHORIZED",
    "AckItem",
    "Database",
    "Dispatch",
    "Health",
    "Orchestrator",
    "Page",
    "Pool",
    "Refused",
    "Settings",
    "SettingsError",
    "SignInFailed",
    "Snapshot",
    "Wakeups",
    "authenticate",
    "authenticate_agent",
    "crypto",
    "dashboard_signin",
    "deadline",
    "enroll",
    "format_age",
    "get_settings",
    "hash_token",
    "is_member",
    "jsoninput",
    "linear",
    "linear_auth",
    "machines",
    "notices",
    "open_pool",
    "orchestrators",
    "pace_text",
    "people",
    "realtime",
    "resolve",
    "sessions",
    "snapshot",
]
