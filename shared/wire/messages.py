"""The messages the contract fixes, as frozen dataclasses (camelCase on the wire), and the names and
reasons it fixes: how a repository and a label are written, why a machine gives a start back.

Not pydantic: importing it is a large part of every cloud function's cold start, and these messages
are built only by our own code (from input it has already checked) and from our own rows."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from types import UnionType
from typing import Any, ClassVar, Literal, Self, get_args, get_type_hints
from uuid import UUID


class Wire:
    """What the messages below share: `wire()`, the message as JSON values under camelCase keys
    (UUIDs and times as strings, None kept), and `from_wire`, the message read back from them
    (camelCase or snake_case keys; unknown keys ignored; nested messages built)."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # (each message below is a dataclass)

    def wire(self) -> dict[str, Any]:
        return {key: _json(getattr(self, name)) for name, key, _ in _shape(type(self))}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Self:
        values: dict[str, Any] = {}
        for name, key, read in _shape(cls):
            value = data[key] if key in data else data.get(name, _MISSING)
            if value is _MISSING:
                continue  # the field's default (none: the constructor says which is missing)
            values[name] = value if value is None or read is None else read(value)
        return cls(**values)


_MISSING = object()
# Per message class: each field's name, its key on the wire, and what reads its value (None: as is).
_SHAPES: dict[type[Wire], tuple[tuple[str, str, Callable[[Any], Any] | None], ...]] = {}


def _shape(cls: type[Wire]) -> tuple[tuple[str, str, Callable[[Any], Any] | None], ...]:
    shape = _SHAPES.get(cls)
    if shape is None:  # worked out on first use: an import, or a poll that finds nothing, never does
        hints = get_type_hints(cls)
        shape = _SHAPES[cls] = tuple((f.name, _camel(f.name), _reader(hints[f.name])) for f in fields(cls))
    return shape


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _reader(hint: Any) -> Callable[[Any], Any] | None:
    """How a field's wire value becomes its type: a message from its mapping, a UUID or a time from
    its string (either one already of its type kept as it is); anything else as it is."""
    kinds = [t for t in get_args(hint) if t is not type(None)] if isinstance(hint, UnionType) else [hint]
    kind = kinds[0] if len(kinds) == 1 else None
    if isinstance(kind, type) and issubclass(kind, Wire):
        message = kind
        return lambda v: v if isinstance(v, message) else message.from_wire(v)
    if kind is UUID:
        return lambda v: v if isinstance(v, UUID) else UUID(v)
    if kind is datetime:
        return lambda v: v if isinstance(v, datetime) else datetime.fromisoformat(v)
    return None


def _json(value: Any) -> Any:
    """A value as pydantic's `model_dump(mode="json")` wrote it (the rows written before are read
    back, and the machines parse it): a message as its `wire()`, a UUID as its string, a time as
    `_instant` writes it, a tuple as a list, a float that JSON cannot hold (NaN, ±inf) as None."""
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, Wire):
        return value.wire()
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return _instant(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _instant(at: datetime) -> str:
    """ISO 8601 as pydantic writes it: `Z` for UTC, else the offset to the minute (`+05:30`)."""
    offset = at.utcoffset()
    text = at.replace(tzinfo=None).isoformat()
    if offset is None:
        return text
    total = offset.total_seconds()
    seconds = int(abs(total) + 0.5)  # (rounded half away from zero, as pydantic-core does)
    if seconds == 0:
        return text + "Z"
    return f"{text}{'-' if total < 0 else '+'}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"


@dataclass(frozen=True, slots=True)
class IssueRef(Wire):
    """The issue a message is about: Linear's id, and what a machine shows of it."""

    id: str
    identifier: str | None = None
    title: str | None = None
    url: str | None = None
    description: str | None = None


MessageKind = Literal["start", "prompt", "stop"]


@dataclass(frozen=True, slots=True)
class Prompt(Wire):
    """What the message asks. On a start of an agent session: `context`, Linear's `promptContext`
    (the request as Linear formats it: issue, thread, guidance), and `body`, the comment the session
    was started from when Linear names it (never the thread's root comment). On a follow-up: `body`,
    the person's message, with its `signal` (`continue`, `select`, `auth`) and `signalMetadata`.
    `guidance` and `previousComments` are Linear's, passed on as they came (a start's)."""

    body: str | None = None
    context: str | None = None
    signal: str | None = None
    signal_metadata: dict[str, Any] | None = None
    guidance: list[dict[str, Any]] | None = None
    previous_comments: list[dict[str, Any]] | None = None


def start_request(issue: IssueRef, body: str | None = None) -> str:
    """The request of a start Linear gave no `promptContext` for (a plain assignment): the issue,
    `identifier: title` then its description, and the comment it was started from if any."""
    head = ": ".join(x for x in (issue.identifier, issue.title) if x)
    return "\n\n".join(x for x in (head, issue.description or "", body or "") if x)


@dataclass(frozen=True, slots=True)
class Repository(Wire):
    """A repository a message is about, or a machine has: the host and `owner/name`."""

    hostname: str
    full_name: str

    @property
    def key(self) -> str:
        return repository_key(self.hostname, self.full_name)


DEFAULT_HOST = "github.com"
HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(:[0-9]{1,5})?$")
# `owner/name`, or a group path (`group/subgroup/name`, as GitLab has them)
FULL_NAME = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){1,5}$")
LABEL = re.compile(r"^[^\x00-\x1f\x7f]{1,64}$")  # a machine's label (compared with Linear's, any case)


def repository_key(hostname: str, full_name: str) -> str:
    """How a repository is compared (routing, the machine's own list): `host/owner/name`, lower
    case (GitHub's names are not case-sensitive)."""
    return f"{hostname.strip().lower()}/{full_name.strip().removesuffix('.git').lower()}"


# `POST /release` with a reason that starts with this: the machine does not have the repository the
# start names (its list changed since it was routed); the service routes the start again instead of
# retrying it on that machine.
REPOSITORY_MISSING = "repository_missing"


@dataclass(frozen=True, slots=True)
class TaskDispatchMessage(Wire):
    """One queued message as a machine claims it: its ids, its lease and what it asks."""

    message_id: UUID
    queue_id: UUID
    session_id: UUID
    org_id: str
    orchestrator_id: UUID
    attempt: int
    claim_token: UUID
    lease_expires_at: datetime
    created_at: datetime
    issue: IssueRef
    agent_session_id: str | None = None
    kind: MessageKind = "start"
    prompt: Prompt | None = None
    repository: Repository | None = None
