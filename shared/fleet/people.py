"""People and their machines: who holds a `/me` session (a person signed in with Linear, separate
from the operators' dashboard session), who a machine belongs to, and a person's own machines.

A person is (workspace, Linear user): they see and revoke only machines registered for exactly that
pair; anyone else's machine is not found (404), as one that does not exist.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from shared.fleet.orchestrators import Orchestrator
from shared.plumbing.db import Pool, Tx, lend, require_tx
from shared.plumbing.sql import query

SESSION_SECONDS = 12 * 3600


@dataclass(frozen=True)
class Person:
    org_id: str
    linear_user_id: str
    name: str | None = None  # as Linear gave it at their last sign-in (None: never signed in here)
    workspace_name: str | None = None

    @property
    def key(self) -> dict[str, str]:
        return {"org_id": self.org_id, "linear_user_id": self.linear_user_id}


def _hash(session: str) -> bytes:
    return hashlib.sha256(session.encode()).digest()


def start_session(tx: Tx, org_id: str, linear_user_id: str) -> str:
    """In the caller's transaction (the sign-in's): a new random session; only its hash is stored."""
    tx = require_tx(tx, "people.start_session")
    session = secrets.token_urlsafe(32)
    tx.execute(
        query("people_session_create"),
        {
            "token_hash": _hash(session),
            "org_id": org_id,
            "linear_user_id": linear_user_id,
            "seconds": SESSION_SECONDS,
        },
    )
    return session


def signed_in(pool: Pool, session: str) -> Person | None:
    """The person holding this /me session cookie, or None (none, unknown, ended or expired)."""
    if not session:
        return None
    with lend(pool) as conn:
        row = conn.execute(query("people_session_get"), {"token_hash": _hash(session)}).fetchone()
    return (
        None
        if row is None
        else Person(row["org_id"], row["linear_user_id"], row["name"], row["workspace_name"])
    )


def end_session(pool: Pool, session: str) -> None:
    with lend(pool) as conn:
        conn.execute(query("people_session_end"), {"token_hash": _hash(session)})


def csrf_token(session: str) -> str:
    """The CSRF token of a /me session's forms: an HMAC under the session, so only a page served to
    the session's holder has it, and nothing more is stored."""
    return hmac.new(session.encode(), b"devpilot /me csrf", hashlib.sha256).hexdigest()


def csrf_ok(session: str, given: str) -> bool:
    return bool(session) and hmac.compare_digest(
        csrf_token(session).encode(), given.encode("utf-8", "replace")
    )


def person(pool: Pool, org_id: str, linear_user_id: str) -> Person:
    """A person, with the names Linear gave at their last sign-in here (None if they never signed in)."""
    with lend(pool) as conn:
        row = conn.execute(
            query("person_names"), {"org_id": org_id, "linear_user_id": linear_user_id}
        ).fetchone()
    return Person(
        org_id, linear_user_id, row["name"] if row else None, row["workspace_name"] if row else None
    )


def owner(pool: Pool, machine: Orchestrator) -> Person:
    """The person a machine belongs to."""
    return person(pool, machine.org_id, machine.linear_user_id)


@dataclass(frozen=True)
class Machine:
    id: UUID
    name: str
    created_at: datetime
    last_seen_at: datetime | None
    listening: bool  # a long-poll of it is waiting now; else it polls (or was never seen)
    queued: int
    issues: list[str] = field(default_factory=list)  # what is queued, first ten, in queue order
    repositories: list[dict[str, str]] = field(default_factory=list)  # as it said last (`/machine`)
    labels: list[str] = field(default_factory=list)
    described_at: datetime | None = None  # when it said so (None: it never did)

    @property
    def has(self) -> list[str]:
        """What it said it has, as one list: `host/owner/name` (github.com left out), then labels."""
        names = [
            r["fullName"] if r.get("hostname") in (None, "github.com") else f"{r['hostname']}/{r['fullName']}"
            for r in self.repositories
        ]
        return [*names, *(f"label {label}" for label in self.labels)]

    @property
    def transport(self) -> str:
        if self.listening:
            return "listening"
        return "polling" if self.last_seen_at else "never"


def machines(pool: Pool, person: Person) -> list[Machine]:
    """The person's active machines, most recently seen first."""
    with lend(pool) as conn:
        rows = conn.execute(query("person_machines"), person.key).fetchall()
    return [
        Machine(
            r["id"],
            r["name"],
            r["created_at"],
            r["last_seen_at"],
            r["listening"],
            int(r["queued"]),
            list(r["issues"] or []),
            list(r["repositories"] or []),
            list(r["labels"] or []),
            r["described_at"],
        )
        for r in rows
    ]


def owns(pool: Pool, person: Person, orchestrator_id: UUID) -> bool:
    with lend(pool) as conn:
        return (
            conn.execute(query("person_owns"), {**person.key, "id": orchestrator_id}).fetchone() is not None
        )


def seen(tx: Tx, org_id: str, linear_user_id: str, name: str, workspace_name: str | None) -> None:
    """In the caller's transaction (a sign-in with Linear, `shared.fleet.enroll`): the person's name and
    workspace's name as Linear gave them last, for the pages that show them (`person_seen`)."""
    require_tx(tx, "people.seen").execute(
        query("person_seen"),
        {"org_id": org_id, "linear_user_id": linear_user_id, "name": name, "workspace_name": workspace_name},
    )
