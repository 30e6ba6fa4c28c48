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

from shared import crypto, linear_api, linear_auth
from shared.db import Pool, Tx, lend, require_tx
from shared.settings import Settings
from shared.sql import query

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("devpilot.notices")

AGENT_ACTIVITY = """mutation AgentActivityCreate($input: AgentActivityCreateInput!) {
  agentActivityCreate(input: $input) { success agentActivity { id } }
}"""
COMMENT = """mutation CommentCreate($input: CommentCreateInput!) {
  commentCreate(input: $input) { success comment { id } }
}"""


def list_credentials(pool: Pool) -> list[dict[str, Any]]:
    with lend(pool) as conn:
        return [dict(r) for r in conn.execute(query("credentials_list"))]


def delete_credentials(pool: Pool, org_id: str) -> bool:
    with lend(pool) as conn:
        return conn.execute(query("credentials_delete"), {"org_id": org_id}).fetchone() is not None


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


def send_pending(
    pool: Pool, settings: Settings, ids: list[UUID] | None = None, limit: int = 50
) -> SendResult:
    """Send due notices (the given ones, or any): each is taken under a lease, posted, then marked
    sent (with Linear's id) or due again after backoff. Never raises for Linear's answers.

    One agent session's posts go out in the order they were accepted: a post is not taken while an
    earlier one of its agent session is unsent (notice_take). So after a round, the next post of each
    agent session that just went out is looked for at once, instead of waiting for the sweep."""
    if ids is not None and not ids:
        return SendResult(0, 0)
    total = SendResult(0, 0)
    follow: list[str] | None = None
    for _ in range(MAX_ROUNDS):
        with lend(pool) as conn:
            rows = conn.execute(
                query("notice_take"), {"ids": ids, "agent_sessions": follow, "limit": limit}
            ).fetchall()
        if not rows:
            break
        result, follow = _send(pool, settings, rows)
        total = SendResult(total.sent + result.sent, total.failed + result.failed)
        if not follow:
            break
    return total


MAX_ROUNDS = 20


def _post(http: httpx.Client, settings: Settings, post: dict[str, Any], token: str) -> httpx.Response:
    return http.post(
        settings.linear_api_url,
        json=post,
        headers={"Authorization": linear_auth.authorization(token), "Content-Type": "application/json"},
    )


def _send(pool: Pool, settings: Settings, rows: list[Any]) -> tuple[SendResult, list[str]]:
    import httpx  # (here, not at the top: see shared.linear_auth)

    sent = failed = 0
    went_out: list[str] = []
    tokens = linear_auth.Tokens(pool, settings)
    http = linear_api.client(settings)  # (the process's: its connections are reused)
    for row in rows:
        error: str | None = None
        linear_id: str | None = None
        waits = False  # no working connection: back to the outbox, attempt not counted
        post = request(row)
        try:
            token = tokens.get(row["org_id"]) if post is not None else None
            if post is None:
                linear_id = "not-applicable"
            elif token is None:
                error, waits = "no Linear connection for this org (or it was disconnected)", True
            else:
                r = _post(http, settings, post, token)
                if r.status_code == 401:  # expired or revoked: refresh once, then try again
                    token = tokens.refused(row["org_id"])
                    r = _post(http, settings, post, token) if token else r
                    waits = token is None
                if waits:
                    error = "Linear refused the refresh: the org is disconnected"
                elif r.status_code == 200:
                    linear_id = _linear_id(r.json())
                    if linear_id is None:
                        error = f"Linear refused: {str(r.json().get('errors'))[:300]}"
                else:
                    error = f"Linear answered HTTP {r.status_code}"
        except crypto.InvalidToken:
            error = "stored Linear token cannot be decrypted (key changed?)"
        except linear_auth.RefreshFailed as exc:
            error = f"refreshing the Linear token failed: {exc}"
        except (httpx.HTTPError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        with lend(pool) as conn:
            if waits:
                conn.execute(query("notice_wait"), {"id": row["id"], "error": error})
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
    return SendResult(sent, failed), went_out
