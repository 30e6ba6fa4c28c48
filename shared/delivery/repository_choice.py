"""Which repository a start needs, when the user's machines differ in what they have.

Run by the routing step (`shared.delivery.routing`), after the webhook's transaction, never inside Linear's
5 s. Among the user's active machines (`shared.fleet.machines` says what each has):
1. all alike (one machine, or the same repositories and labels): as before, the most recently seen
   machine; Linear is not asked (the webhook's one statement routes these itself; this is for a
   request written before the machines changed);
2. the label rule first: an issue label named like a machine label (`gpu`) keeps only the machines
   that have it (those with the most of the issue's such labels);
3. then Linear's `issueRepositorySuggestions` over the union of those machines' repositories: a
   suggestion at or above DEVPILOT_REPOSITORY_CONFIDENCE picks the repository; below it, in an agent
   session, the person is asked (a `select` elicitation listing the candidates) and their choice
   picks it; a plain assignment (no one to ask) takes the best suggestion;
4. Linear unreachable, or the org not connected: as before (the most recently seen machine), and
   the session's page says so.
The machine itself is picked in the routing transaction (`repository_machine` in routing.sql): the
most recently seen of the candidates that has the chosen repository.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from shared.delivery.models import DispatchPayload
from shared.linear import api as linear_api
from shared.linear import pace
from shared.plumbing.db import Pool, lend
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.wire.messages import DEFAULT_HOST, Repository, repository_key

LABELS = """query DevpilotIssueLabels($id: String!) {
  issue(id: $id) { id labels(first: 50) { nodes { name } } }
}"""
SUGGESTIONS = """query DevpilotRepositorySuggestions(
  $issueId: String!, $candidates: [CandidateRepository!]!, $agentSessionId: String
) {
  issueRepositorySuggestions(
    issueId: $issueId, candidateRepositories: $candidates, agentSessionId: $agentSessionId
  ) { suggestions { repositoryFullName hostname confidence } }
}"""
QUESTION = "Which repository should I work in?"
UNMATCHED = "“{answer}” is not one of the repositories your machines have. Which repository should I work in?"


@dataclass(frozen=True)
class Machine:
    id: UUID
    name: str
    keys: frozenset[str]
    labels: frozenset[str]
    shape: str
    repositories: tuple[Repository, ...]


@dataclass(frozen=True)
class Candidate:
    """A repository the person may pick, with Linear's confidence in it (None: not suggested)."""

    repository: Repository
    confidence: float | None = None

    @property
    def key(self) -> str:
        return repository_key(self.repository.hostname, self.repository.full_name)

    @property
    def label(self) -> str:
        r = self.repository
        return r.full_name if r.hostname == DEFAULT_HOST else f"{r.hostname}/{r.full_name}"


@dataclass(frozen=True)
class Choice:
    """What the routing transaction does with a start: queue it for the most recently seen of
    `machines` (None: any of the user's) that has `repository` (None: any), or, with `ask`, ask the
    person which of those candidates. `note` says how it was chosen (the session's page)."""

    repository: Repository | None = None
    machines: list[UUID] | None = None
    note: str | None = None
    ask: list[Candidate] | None = None
    question: str = QUESTION
    alike: bool = False

    def stored(self) -> dict[str, Any]:
        """The candidates kept with an asked request, to read the answer by."""
        return {
            "repositories": [{**c.repository.wire(), "confidence": c.confidence} for c in self.ask or []],
            "machines": None if self.machines is None else [str(m) for m in self.machines],
        }

    def options(self) -> dict[str, Any]:
        """Linear's `select` signal metadata: one option per candidate."""
        return {"options": [{"label": c.label, "value": c.label} for c in self.ask or []]}


def choose(
    pool: Pool,
    settings: Settings,
    row: dict[str, Any],
    message: DispatchPayload,
    user: str,
    labels: list[str] | None = None,
) -> Choice:
    """The repository for `message`, a start for `user`'s machines. Never raises for Linear's
    answers: Linear not reachable is rule 4. `labels`: the issue's, when already read."""
    if row.get("choice") is not None and row.get("candidates"):
        return _answered(row["candidates"], row["choice"])
    machines = _machines(pool, row["org_id"], user)
    if message.repository is not None:  # routed again (its machine did not have it): who has it
        key = repository_key(message.repository.hostname, message.repository.full_name)
        if any(key in m.keys for m in machines):
            return Choice(repository=message.repository, note=f"{_show(message.repository)}: routed again")
    if len({m.shape for m in machines}) <= 1:
        return Choice(alike=True)
    candidates, label_note = machines, None
    wanted_labels = frozenset().union(*(m.labels for m in machines))
    if wanted_labels:
        try:
            issue_labels = labels if labels is not None else _issue_labels(pool, settings, row)
        except (linear_api.NotConnected, linear_api.Unavailable) as exc:
            _paced(pool, row, exc)
            return Choice(note=_as_before(exc))
        candidates, label_note = _narrow(machines, {lb.lower() for lb in issue_labels} & wanted_labels)
    ids = [m.id for m in candidates]
    union = _union(candidates)
    if len({m.keys for m in candidates}) <= 1:  # alike once narrowed: no repository to choose
        only = union[0] if len(union) == 1 else None
        return Choice(repository=only, machines=ids, note=label_note)
    try:
        ranked = _suggestions(pool, settings, row, message, union)
    except (linear_api.NotConnected, linear_api.Unavailable) as exc:
        _paced(pool, row, exc)
        return Choice(machines=ids, note=_join(label_note, _as_before(exc)))
    best = ranked[0] if ranked and ranked[0].confidence is not None else None
    if best is not None and best.confidence is not None and best.confidence >= settings.repository_confidence:
        note = f"{_show(best.repository)}: Linear's suggestion (confidence {best.confidence:.2f})"
        return Choice(repository=best.repository, machines=ids, note=_join(label_note, note))
    if message.agent_session_id is not None:  # someone to ask
        return Choice(machines=ids, ask=ranked, note=label_note)
    if best is not None and best.confidence is not None:
        note = (
            f"{_show(best.repository)}: Linear's best suggestion (confidence {best.confidence:.2f}, "
            f"below {settings.repository_confidence:g}; a plain assignment has no one to ask)"
        )
        return Choice(repository=best.repository, machines=ids, note=_join(label_note, note))
    note = "Linear suggested none of the repositories: routed to the most recently seen machine"
    return Choice(machines=ids, note=_join(label_note, note))


def _answered(stored: dict[str, Any], answer: str) -> Choice:
    """The person's pick (a `prompted` with the `select` signal), read against what was asked."""
    asked = [
        Candidate(Repository.from_wire(r), r.get("confidence")) for r in stored.get("repositories") or []
    ]
    ids = stored.get("machines")
    machines = None if ids is None else [UUID(m) for m in ids]
    picked = match(asked, answer)
    if picked is None:
        return Choice(machines=machines, ask=asked, question=UNMATCHED.format(answer=answer.strip()[:200]))
    return Choice(
        repository=picked.repository, machines=machines, note=f"{_show(picked.repository)}: picked in Linear"
    )


def match(candidates: list[Candidate], answer: str) -> Candidate | None:
    """The candidate an answer names: its label or `host/owner/name` (a URL too), or, when only one
    candidate is called so, its `owner/name` or its name alone. Case does not matter."""
    said = re.sub(r"^[a-z]+://", "", answer.strip().lower()).removesuffix("/").removesuffix(".git")
    if not said:
        return None
    for c in candidates:
        if said in (c.key, c.label.lower()):
            return c
    for found in (
        [c for c in candidates if c.repository.full_name.lower() == said],
        [c for c in candidates if c.repository.full_name.lower().rsplit("/", 1)[-1] == said],
    ):
        if len(found) == 1:
            return found[0]
    return None


def _machines(pool: Pool, org: str, user: str) -> list[Machine]:
    with lend(pool) as conn:
        rows = conn.execute(query("user_machines"), {"org_id": org, "route_user": user}).fetchall()
    return [
        Machine(
            r["id"],
            r["name"],
            frozenset(r["repository_keys"]),
            frozenset(r["labels"]),
            r["routing_shape"],
            tuple(Repository.from_wire(x) for x in r["repositories"]),
        )
        for r in rows
    ]


def _narrow(machines: list[Machine], wanted: set[str]) -> tuple[list[Machine], str | None]:
    """The label rule: the machines with the most of the issue's labels that name machine labels."""
    if not wanted:
        return machines, None
    score = {m.id: len(m.labels & wanted) for m in machines}
    best = max(score.values())
    kept = [m for m in machines if score[m.id] == best]
    return kept, f"label {', '.join(sorted(wanted))}: {', '.join(m.name for m in kept)}"


def _union(machines: list[Machine]) -> list[Repository]:
    """Every repository of these machines, once each, in the order the machines are seen."""
    seen: set[str] = set()
    out: list[Repository] = []
    for m in machines:
        for r in m.repositories:
            key = repository_key(r.hostname, r.full_name)
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out


def _issue_labels(pool: Pool, settings: Settings, row: dict[str, Any]) -> list[str]:
    data = linear_api.graphql(pool, settings, row["org_id"], LABELS, {"id": row["issue_id"]})
    return labels_of(data.get("issue") if isinstance(data, dict) else None)


def labels_of(issue: Any) -> list[str]:
    """The label names of an `issue { labels { nodes { name } } }` answer."""
    if not isinstance(issue, dict):
        return []
    nodes = (issue.get("labels") or {}).get("nodes") or []
    return [n["name"] for n in nodes if isinstance(n, dict) and isinstance(n.get("name"), str)]


def _suggestions(
    pool: Pool, settings: Settings, row: dict[str, Any], message: DispatchPayload, union: list[Repository]
) -> list[Candidate]:
    """Every candidate, Linear's suggestions first (most confident first), the rest after."""
    variables = {
        "issueId": row["issue_id"],
        "candidates": [{"hostname": r.hostname, "repositoryFullName": r.full_name} for r in union],
        "agentSessionId": message.agent_session_id,
    }
    data = linear_api.graphql(pool, settings, row["org_id"], SUGGESTIONS, variables)
    answer = (data.get("issueRepositorySuggestions") or {}) if isinstance(data, dict) else {}
    confidence: dict[str, float] = {}
    for s in answer.get("suggestions") or []:
        if not isinstance(s, dict) or not isinstance(s.get("repositoryFullName"), str):
            continue
        key = repository_key(s.get("hostname") or DEFAULT_HOST, s["repositoryFullName"])
        if isinstance(s.get("confidence"), int | float):
            confidence[key] = max(confidence.get(key, 0.0), float(s["confidence"]))
    ranked = [Candidate(r, confidence.get(repository_key(r.hostname, r.full_name))) for r in union]
    ranked.sort(key=lambda c: -(c.confidence if c.confidence is not None else -1.0))
    return ranked


def _paced(pool: Pool, row: dict[str, Any], exc: Exception) -> None:
    """A read Linear refused for its rate limit: routing goes on without it (rule 4), and the org's
    pace is recorded, so its posts wait too."""
    if isinstance(exc, linear_api.RateLimited):
        pace.record(pool, row["org_id"], exc)


def _as_before(exc: Exception) -> str:
    why = "the workspace is not connected" if isinstance(exc, linear_api.NotConnected) else str(exc)
    return (
        f"Linear could not be asked which repository this needs ({why}): routed as without "
        "repositories, to the most recently seen machine"
    )


def _show(r: Repository) -> str:
    return r.full_name if r.hostname == DEFAULT_HOST else f"{r.hostname}/{r.full_name}"


def _join(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None
