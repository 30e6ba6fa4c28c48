"""What a machine has: the repositories checked out on it and its labels, as its orchestrator said
last (`POST /machine`, sent on every start, so a change needs no admin).

Routing compares machines by two things kept beside the machine's row: each repository's key
(`host/owner/name`, lower case: GitHub's names are not case-sensitive) and a digest of the keys and
labels together (`routing_shape`). The webhook's one statement compares the digests of a user's
machines (`route` in shared/queries/intake.sql): alike, the start goes to the most recently seen
one as before; not alike, it is routed by repository after the commit (`shared.delivery.repository_choice`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from uuid import UUID

from psycopg.types.json import Jsonb

from shared.plumbing.db import Pool, Tx, require_tx, transaction
from shared.plumbing.sql import query
from shared.wire.messages import Repository

MAX_REPOSITORIES = 100
MAX_LABELS = 50


def normalise(repositories: list[Repository], labels: list[str]) -> tuple[list[Repository], list[str]]:
    """Each repository once (by key, the first spelling kept; the host lower case), each label once
    (lower case: labels are compared with Linear's label names without regard to case)."""
    seen: set[str] = set()
    repos: list[Repository] = []
    for r in repositories:
        repo = Repository(r.hostname.strip().lower(), r.full_name.strip().removesuffix(".git"))
        if repo.key not in seen:
            seen.add(repo.key)
            repos.append(repo)
    return repos, sorted({label.strip().lower() for label in labels if label.strip()})


def shape(keys: list[str], labels: list[str]) -> str:
    """The digest the webhook's statement compares: equal exactly when two machines have the same
    repositories and labels; '' for a machine that has said nothing (as every machine was before)."""
    if not keys and not labels:
        return ""
    text = "\n".join(sorted(keys)) + "\x00" + "\n".join(sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Described:
    orchestrator_id: UUID
    name: str
    repositories: list[dict[str, str]]
    labels: list[str]


def describe(
    pool: Pool, orchestrator_id: UUID, repositories: list[Repository], labels: list[str]
) -> Described | None:
    """Replace what the machine said before, in one statement. None: not an active machine."""
    with transaction(pool) as tx:
        return describe_in(tx, orchestrator_id, repositories, labels)


def describe_in(
    tx: Tx, orchestrator_id: UUID, repositories: list[Repository], labels: list[str]
) -> Described | None:
    """`describe` in the caller's transaction."""
    repos, labels = normalise(repositories, labels)
    keys = [r.key for r in repos]
    row = require_tx(tx, "machines.describe").one(
        query("machine_describe"),
        {
            "id": orchestrator_id,
            "repositories": Jsonb([r.wire() for r in repos]),
            "repository_keys": keys,
            "labels": labels,
            "routing_shape": shape(keys, labels),
        },
    )
    if row is None:
        return None
    return Described(row["id"], row["name"], list(row["repositories"]), list(row["labels"]))


def forget(tx: Tx, orchestrator_id: UUID, key: str) -> None:
    """In the caller's transaction: the machine said it does not have this repository (it gave a
    start naming it back), so routing no longer sends it there, until the machine says otherwise."""
    row = require_tx(tx, "machines.forget").one(query("machine_inventory"), {"id": orchestrator_id})
    if row is None or key not in row["repository_keys"]:
        return
    kept = [Repository(r["hostname"], r["fullName"]) for r in row["repositories"]]
    describe_in(tx, orchestrator_id, [r for r in kept if r.key != key], list(row["labels"]))
