"""Orchestrator registry: the machines that take work, and their bearer tokens.

A token is 32 random bytes (URL-safe), shown once at registration and stored only as its SHA-256.
Looking a token up by its hash means the comparison never touches the token itself, so it is not a
timing oracle; a revoked orchestrator's token stops working on its next request.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from shared.plumbing.db import Pool, Tx, lend, require_tx, transaction
from shared.plumbing.sql import query
from shared.wire import agent_tokens

UNAUTHORIZED = "missing, wrong or revoked orchestrator token"  # what a refused machine is told
TOKEN_PREFIX = "dpo_"  # the visible prefix of every machine token, not a secret  # nosec B105


class Orchestrator(NamedTuple):
    id: UUID
    org_id: str
    linear_user_id: str
    name: str


class Registered(NamedTuple):
    id: UUID
    token: str


def hash_token(token: str) -> bytes:
    return agent_tokens.token_hash(token)


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def register(pool: Pool, *, org_id: str, linear_user_id: str, name: str) -> Registered:
    token = new_token()
    with transaction(pool) as tx:
        row = tx.one(
            query("orchestrator_insert"),
            {
                "org_id": org_id,
                "linear_user_id": linear_user_id,
                "name": name,
                "token_hash": hash_token(token),
            },
        )
    assert row is not None
    return Registered(row["id"], token)


def authenticate_agent(pool: Pool, token: str) -> tuple[Orchestrator, str] | None:
    """An agent COMMAND's token (shared.wire.agent_tokens): its machine, and the one agent session it
    may speak in; None when it is malformed, forged, expired, or its machine is revoked."""
    claimed = agent_tokens.parse(token)
    if claimed is None:
        return None
    with lend(pool) as conn:
        row = conn.execute(query("orchestrator_by_id"), {"id": claimed.orchestrator_id}).fetchone()
    if row is None or not claimed.valid(bytes(row["token_hash"])):
        return None
    return Orchestrator(
        row["id"], row["org_id"], row["linear_user_id"], row["name"]
    ), claimed.agent_session_id


def authenticate(pool: Pool, token: str, *, seen: bool = True) -> Orchestrator | None:
    """The active machine holding this token, recorded as seen now (unless not `seen`: a person
    reading about their machine); None for any other token."""
    statement = query("orchestrator_by_token" if seen else "orchestrator_by_token_read")
    with lend(pool) as conn:
        row = conn.execute(statement, {"token_hash": hash_token(token)}).fetchone()
    if row is None:
        return None
    return Orchestrator(row["id"], row["org_id"], row["linear_user_id"], row["name"])


class Listed(NamedTuple):
    id: UUID
    org_id: str
    linear_user_id: str
    name: str
    created_at: datetime
    last_seen_at: datetime | None
    revoked_at: datetime | None
    repositories: list[dict[str, str]]  # as it said last (`shared.fleet.machines`)
    labels: list[str]


def list_all(pool: Pool) -> list[Listed]:
    with lend(pool) as conn:
        return [Listed(**r) for r in conn.execute(query("orchestrator_list")).fetchall()]


def mark_revoked(tx: Tx, orchestrator_id: UUID) -> bool:
    """In the caller's transaction (`shared.delivery.queue.revoke`, which then moves or cancels the machine's
    work): the machine revoked, its token no longer working, once every enqueue to it has committed
    (`orchestrator_revoke`). False: no such machine. Revoking again keeps the first time."""
    return (
        require_tx(tx, "mark_revoked").one(query("orchestrator_revoke"), {"id": orchestrator_id}) is not None
    )


def is_active(pool: Pool, orchestrator_id: UUID, token_hash: bytes | None = None) -> bool:
    """Not revoked, and (with `token_hash`) still this token's machine."""
    with lend(pool) as conn:
        row = conn.execute(query("orchestrator_active"), {"id": orchestrator_id, "token_hash": token_hash})
        return row.fetchone() is not None


def mark_listening(pool: Pool, orchestrator_id: UUID, seconds: float, margin: float) -> None:
    """A long-poll of `seconds` is about to look at the table: until it ends (with `margin` to
    spare), enqueues to this machine send their NOTIFY. One statement on an autocommit connection,
    so it is committed before the look (`mark_listening` in orchestrators.sql says why that order
    leaves no wake-up behind)."""
    with lend(pool) as conn:
        conn.execute(query("mark_listening"), {"id": orchestrator_id, "seconds": seconds, "margin": margin})


class Enrolled(NamedTuple):
    id: UUID
    token: str  # shown once; only its hash is stored
    replaced: bool  # the person's active machine of that name got the token (else: a new machine)


def enroll(tx: Tx, org_id: str, linear_user_id: str, name: str) -> Enrolled:
    """In the caller's transaction (an enrollment redeemed, `shared.fleet.enroll`): a new token for the
    person's active machine of that name (its old token stops at once; its id and queued work
    stay), or a new machine under that name. Enrollments of one name by one person take turns
    (`enroll_turn`), so two at once never register the name twice."""
    tx = require_tx(tx, "orchestrators.enroll")
    token = new_token()
    who = {"org_id": org_id, "linear_user_id": linear_user_id, "name": name}
    tx.execute(query("enroll_turn"), who)
    row = tx.one(query("orchestrator_enroll"), {**who, "token_hash": hash_token(token)})
    assert row is not None
    return Enrolled(row["id"], token, bool(row["replaced"]))
