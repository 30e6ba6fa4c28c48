"""Telling Linear what happened, through the `linear_notices` table — never a dual write.

A notice is written in the transaction of the state change that causes it (intake, ack, release,
sweep). After that commit the handler tries to send it at once, so an agent session hears back
within Linear's 10 s; whatever is still unsent (Linear down, a crash between commit and send) the
sweep sends later with the same backoff rule and attempt limit as deliveries. A notice is marked
sent once, with Linear's returned id, so a retry after a success never posts twice.

Mutations: agent sessions get `agentActivityCreate` (a `thought` when dispatched and delivered, an
`error` when it failed); plain assignments get a `commentCreate` on the issue when no machine
took the work.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from shared.linear import actions as linear_actions
from shared.linear import api as linear_api
from shared.linear import auth as linear_auth
from shared.linear import pace
from shared.plumbing import crypto
from shared.plumbing.db import Pool, Tx, lend, require_tx, take_in_rounds
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("devpilot.notices")

AGENT_ACTIVITY = """mutation AgentActivityCreate($input: AgentActivityCreateInput!) {
  agentActivityCreate(input: $input) { success agentActivity { id } }
}"""
COMMENT = """mutation CommentCreate($input: CommentCreateInput!) {
  commentCreate(input: $input) { success comment { id } }
}"""


def accept_activity(tx: Tx, params: dict[str, Any]) -> bool:
    """In the caller's transaction (`shared.dispatch`, who may post checked first): the agent's
    activity into the outbox (`activity_insert`), or the same post again (its id seen before:
    nothing is written). False: the id is someone else's (`activity_same`)."""
    tx = require_tx(tx, "notices.accept_activity")
    if tx.one(query("activity_insert"), params) is not None:
        return True
    same = tx.one(query("activity_same"), params)
    return same is not None and bool(same["same"])


def accept_plan(tx: Tx, params: dict[str, Any]) -> UUID:
    """In the caller's transaction (who may post checked first): the agent's plan into the outbox
    (`plan_insert`)."""
    row = require_tx(tx, "notices.accept_plan").one(query("plan_insert"), params)
    assert row is not None
    return UUID(str(row["id"]))


def write(
    tx: Tx,
    *,
    org_id: str,
    kind: str,
    body: str,
    session_id: UUID | None,
    agent_session_id: str | None,
    issue_id: str | None,
) -> UUID | None:
    """In the caller's transaction; only for orgs Linear is told about (else nothing is written)."""
    tx = require_tx(tx, "notices.write")
    row = tx.one(
        query("notice_insert"),
        {
            "org_id": org_id,
            "session_id": session_id,
            "kind": kind,
            "agent_session_id": agent_session_id,
            "issue_id": issue_id,
            "body": body,
        },
    )
    return None if row is None else row["id"]


@dataclass(frozen=True)
class SendResult:
    sent: int
    failed: int


# The activity type of the service's own notices in an agent session.
ACTIVITY_TYPE = {"dispatched": "thought", "delivered": "thought", "failed": "error", "stopped": "response"}


def request(row: dict[str, Any]) -> dict[str, Any] | None:
    """The GraphQL request for one outbox row. The row's id is sent as Linear's `input.id`, so a
    post retried after a timeout (that Linear did receive) never shows twice."""
    if row["agent_session_id"]:
        content = row.get("content") or {"type": ACTIVITY_TYPE[row["kind"]], "body": row["body"]}
        activity: dict[str, Any] = {
            "id": str(row["id"]),
            "agentSessionId": row["agent_session_id"],
            "content": content,
        }
        if row.get("ephemeral"):
            activity["ephemeral"] = True
        if row.get("signal"):  # an elicitation's select options or auth link
            activity["signal"] = row["signal"]
            activity["signalMetadata"] = row.get("signal_metadata") or {}
        return {"query": AGENT_ACTIVITY, "variables": {"input": activity}}
    if row["issue_id"] and row["kind"] == "failed":
        comment = {"id": str(row["id"]), "issueId": row["issue_id"], "body": row["body"]}
        return {"query": COMMENT, "variables": {"input": comment}}
    return None


def _linear_id(payload: dict[str, Any]) -> str | None:
    data = payload.get("data") or {}
    for key in ("agentActivityCreate", "commentCreate"):
        result = data.get(key)
        if isinstance(result, dict) and result.get("success"):
            entity = result.get("agentActivity") or result.get("comment") or {}
            return str(entity.get("id") or "ok")
    return None


def send_pending(pool: Pool, settings: Settings, ids: list[UUID] | None = None) -> SendResult:
    """Send due notices (the given ones, or any): each is taken under a lease, posted, then marked
    sent (with Linear's id) or due again after backoff. Never raises for Linear's answers.

    One agent session's posts go out in the order they were accepted: a post is not taken while an
    earlier one of its agent session is unsent (`notice_taking` in notices.sql). So after a round,
    the next post of each agent session that just went out is looked for at once, instead of
    waiting for the sweep."""
    if ids is not None and not ids:
        return SendResult(0, 0)
    total = SendResult(0, 0)

    def handle(rows: list[Any]) -> list[str]:
        nonlocal total
        result, went_out = _send(pool, settings, rows)
        total = SendResult(total.sent + result.sent, total.failed + result.failed)
        return went_out

    # Named posts by their keys; the sweep's round (none named) any due post of a connected org.
    first = "notice_take_due" if ids is None else None
    take_in_rounds(pool, "notice_take", {"ids": ids}, handle, first=first)
    return total


class _Waits(Exception):
    """No working connection for the org: the post goes back to the outbox, its attempt not counted."""


class _Poster:
    """Posts GraphQL for one org (`linear_api.ask`): no working connection is `_Waits`; Linear's
    refusal is `linear_api.Refused` (`linear_actions.Refused`), with its words."""

    def __init__(
        self, http: httpx.Client, settings: Settings, tokens: linear_auth.Tokens, org_id: str
    ) -> None:
        self.http, self.settings, self.tokens, self.org_id = http, settings, tokens, org_id

    def __call__(self, document: str, variables: dict[str, Any]) -> dict[str, Any]:
        try:
            return linear_api.ask(self.http, self.settings, self.tokens, self.org_id, document, variables)
        except linear_api.NotConnected as exc:
            raise _Waits(str(exc)) from None


def _attempt(row: dict[str, Any], post: _Poster) -> str:
    """One post of one outbox row: Linear's id (or what the step decided)."""
    if row["kind"] in linear_actions.KINDS:
        return linear_actions.perform(row, post)
    if linear_actions.is_alias(row["agent_session_id"]):
        raise linear_actions.Refused("no agent session in Linear to post in yet")
    req = request(row)
    if req is None:
        return "not-applicable"
    linear_id = _linear_id({"data": post(req["query"], req["variables"])})
    if linear_id is None:
        raise linear_actions.Refused("Linear did not confirm the post")
    return linear_id


def _send(pool: Pool, settings: Settings, rows: list[Any]) -> tuple[SendResult, list[str]]:
    import httpx  # (here, not at the top: see shared.linear.auth)

    sent = failed = 0
    went_out: list[str] = []
    tokens = linear_auth.Tokens(pool, settings)
    http = linear_api.client(settings)  # (the process's: its connections are reused)
    paced: set[str] = set()  # orgs Linear refused for its rate limit in this round
    for row in rows:
        row = dict(row)
        error: str | None = None
        linear_id: str | None = None
        waits = False  # no working connection: back to the outbox, attempt not counted
        if row["org_id"] in paced:  # the org waits now: the rest of its round goes back untried
            with lend(pool) as conn:
                conn.execute(
                    query("notice_wait"), {"id": row["id"], "error": "waiting for Linear's rate limit"}
                )
            continue
        try:
            linear_id = _attempt(row, _Poster(http, settings, tokens, row["org_id"]))
        except _Waits as exc:
            error, waits = str(exc), True
        except linear_api.RateLimited as exc:  # not an attempt: the org waits, then this goes first
            paced.add(row["org_id"])
            with lend(pool) as conn:
                conn.execute(
                    query("notice_ratelimited"),
                    {"id": row["id"], "error": str(exc)[:300], **pace.params(row["org_id"], exc)},
                )
            log.warning(
                '{"event":"linear_rate_limited","noticeId":"%s","waitSeconds":%d}', row["id"], exc.seconds
            )
            continue
        except linear_actions.Refused as exc:
            error = str(exc)[:500]
        except crypto.InvalidToken:
            error = "stored Linear token cannot be decrypted (key changed?)"
        except linear_auth.RefreshFailed as exc:
            error = f"refreshing the Linear token failed: {exc}"
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        with lend(pool) as conn:
            if waits:
                conn.execute(query("notice_wait"), {"id": row["id"], "error": error})
            elif error is None and row["kind"] == "session_create":
                conn.execute(
                    query("notice_session_created"), {"id": row["id"], "agent_session_id": linear_id}
                )
                sent += 1
                went_out.append(str(linear_id))
            elif error is None:
                conn.execute(query("notice_sent"), {"id": row["id"], "linear_id": linear_id})
                sent += 1
                if row["agent_session_id"]:
                    went_out.append(row["agent_session_id"])
            else:
                conn.execute(
                    query("notice_failed"),
                    {"id": row["id"], "error": error, **settings.retry_params()},
                )
                failed += 1
                log.warning(
                    '{"event":"notice_failed","noticeId":"%s","attempt":%d}', row["id"], row["attempts"]
                )
                if row["kind"] == "session_create":
                    _gave_up_opening(conn, row, error)
    return SendResult(sent, failed), went_out


def _gave_up_opening(conn: Any, row: dict[str, Any], error: str) -> None:
    """The agent session of a plain assignment was given up: so is what waited under its alias."""
    gave_up = conn.execute(query("notice_given_up"), {"id": row["id"]}).fetchone()
    if gave_up is not None and gave_up["gave_up"]:
        conn.execute(
            query("notice_alias_gave_up"),
            {"id": row["id"], "alias": row["agent_session_id"], "error": error[:300]},
        )
