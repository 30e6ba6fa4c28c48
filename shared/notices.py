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

import base64
import hashlib
import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
from cryptography.fernet import Fernet, InvalidToken

from shared.db import Pool, Tx, require_tx
from shared.settings import Settings
from shared.sql import query

log = logging.getLogger("devpilot.notices")

AGENT_ACTIVITY = """mutation AgentActivityCreate($input: AgentActivityCreateInput!) {
  agentActivityCreate(input: $input) { success agentActivity { id } }
}"""
COMMENT = """mutation CommentCreate($input: CommentCreateInput!) {
  commentCreate(input: $input) { success comment { id } }
}"""


def _fernet(settings: Settings) -> Fernet:
    secret = settings.credentials_key or settings.admin_token
    if not secret:
        raise RuntimeError(
            "DEVPILOT_CREDENTIALS_KEY (or DEVPILOT_ADMIN_TOKEN) is needed to store Linear tokens"
        )
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest()))


def store_credentials(pool: Pool, settings: Settings, org_id: str, access_token: str) -> None:
    with pool.connection() as conn:
        conn.execute(
            query("credentials_upsert"),
            {"org_id": org_id, "token": _fernet(settings).encrypt(access_token.encode())},
        )


def list_credentials(pool: Pool) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return [dict(r) for r in conn.execute(query("credentials_list"))]


def delete_credentials(pool: Pool, org_id: str) -> bool:
    with pool.connection() as conn:
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


def _request(row: dict[str, Any]) -> dict[str, Any] | None:
    if row["agent_session_id"]:
        kind = "error" if row["kind"] == "failed" else "thought"
        return {
            "query": AGENT_ACTIVITY,
            "variables": {
                "input": {
                    "agentSessionId": row["agent_session_id"],
                    "content": {"type": kind, "body": row["body"]},
                }
            },
        }
    if row["issue_id"] and row["kind"] == "failed":
        return {"query": COMMENT, "variables": {"input": {"issueId": row["issue_id"], "body": row["body"]}}}
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
    sent (with Linear's id) or due again after backoff. Never raises for Linear's answers."""
    if ids is not None and not ids:
        return SendResult(0, 0)
    with pool.connection() as conn:
        rows = conn.execute(query("notice_take"), {"ids": ids, "limit": limit}).fetchall()
    sent = failed = 0
    fernet = _fernet(settings) if rows else None
    with httpx.Client(timeout=settings.linear_timeout_seconds) as http:
        for row in rows:
            error: str | None = None
            linear_id: str | None = None
            request = _request(row)
            try:
                if request is None:
                    linear_id = "not-applicable"
                elif row["token_encrypted"] is None:
                    error = "no Linear credentials for this org"
                else:
                    assert fernet is not None
                    token = fernet.decrypt(bytes(row["token_encrypted"])).decode()
                    r = http.post(
                        settings.linear_api_url,
                        json=request,
                        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                    )
                    if r.status_code == 200:
                        linear_id = _linear_id(r.json())
                        if linear_id is None:
                            error = f"Linear refused: {str(r.json().get('errors'))[:300]}"
                    else:
                        error = f"Linear answered HTTP {r.status_code}"
            except InvalidToken:
                error = "stored Linear token cannot be decrypted (key changed?)"
            except (httpx.HTTPError, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            with pool.connection() as conn:
                if error is None:
                    conn.execute(query("notice_sent"), {"id": row["id"], "linear_id": linear_id})
                    sent += 1
                else:
                    conn.execute(
                        query("notice_failed"),
                        {
                            "id": row["id"],
                            "error": error,
                            "max_attempts": settings.max_attempts,
                            "base": settings.backoff_base_seconds,
                            "cap": settings.backoff_cap_seconds,
                        },
                    )
                    failed += 1
                    log.warning(
                        '{"event":"notice_failed","noticeId":"%s","attempt":%d}', row["id"], row["attempts"]
                    )
    return SendResult(sent, failed)
