"""The bodies of the routes a fleet calls all day (claim, ack, release), read by hand rather than by
pydantic (functions/bodies.py has every other route's): importing pydantic is a large part of a cold
instance's first answer (bench/README.md, Cold start), for three bodies of a few fields. The rules are
pydantic's strict ones, which the other bodies keep: a string where a number belongs (or `true`, or
`5.0`) is a 400, not a guess; unknown fields are ignored; each field is found by its wire name or its
Python name; the 400 names the field (`acks.0.queueId: ...`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self
from uuid import UUID

from functions.plain_body import BodyError as BodyError
from functions.plain_body import PlainBody as PlainBody

NIL = UUID(int=0)  # matches no row and no token: how a malformed id is judged


def loose_uuid(value: str) -> UUID:
    """An id we issued: a malformed one names nothing (404 / superseded), it is not a type error."""
    try:
        return UUID(value)
    except ValueError:
        return NIL


_MISSING = object()


def _get(data: Mapping[str, Any], wire: str, name: str) -> object:
    # The wire name first, as pydantic's populate_by_name does.
    return data.get(wire, data.get(name, _MISSING))


def _int(data: Mapping[str, Any], wire: str, name: str, where: str, *, default: int, lo: int, hi: int) -> int:
    value = _get(data, wire, name)
    if value is _MISSING:
        return default
    if type(value) is not int:  # (bool is an int to Python, not to JSON)
        raise BodyError(where + wire, "must be an integer")
    if not lo <= value <= hi:
        raise BodyError(where + wire, f"must be from {lo} to {hi}")
    return value


def _text(data: Mapping[str, Any], wire: str, name: str, where: str, *, most: int) -> str | None:
    """The field's string, or None when it is absent or null."""
    value = _get(data, wire, name)
    if value is _MISSING or value is None:
        return None
    if not isinstance(value, str):
        raise BodyError(where + wire, "must be a string")
    if len(value) > most:
        raise BodyError(where + wire, f"must be at most {most} characters")
    return value


def _needed(value: str | None, where: str) -> str:
    if value is None:
        raise BodyError(where, "is required")
    return value


@dataclass(frozen=True, slots=True)
class ClaimBody(PlainBody):
    """A poll: how many messages at most, and how long to wait for one (0: not at all)."""

    max: int = 10
    wait_seconds: int = 0

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str = "") -> Self:
        return cls(
            max=_int(data, "max", "max", where, default=10, lo=1, hi=100),
            wait_seconds=_int(data, "waitSeconds", "wait_seconds", where, default=0, lo=0, hi=25),
        )


@dataclass(frozen=True, slots=True)
class AckOne(PlainBody):
    """One ack of a batch."""

    queue_id: str
    claim_token: str

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str = "") -> Self:
        return cls(
            queue_id=_needed(_text(data, "queueId", "queue_id", where, most=100), where + "queueId"),
            claim_token=_needed(
                _text(data, "claimToken", "claim_token", where, most=100), where + "claimToken"
            ),
        )


@dataclass(frozen=True, slots=True)
class AckBody(PlainBody):
    """One ack (`queueId`, `claimToken`) or a batch (`acks`): which one, functions/ack.py decides."""

    queue_id: str | None = None
    claim_token: str | None = None
    acks: list[AckOne] | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str = "") -> Self:
        # (in the fields' order, so a body with two faults hears of the one pydantic named)
        queue_id = _text(data, "queueId", "queue_id", where, most=100)
        claim_token = _text(data, "claimToken", "claim_token", where, most=100)
        acks = _get(data, "acks", "acks")
        if acks is _MISSING or acks is None:
            batch = None
        elif not isinstance(acks, list):
            raise BodyError(where + "acks", "must be a list")
        elif not 1 <= len(acks) <= 100:
            raise BodyError(where + "acks", "must hold 1 to 100 acks")
        else:
            batch = [_one(item, f"{where}acks.{i}") for i, item in enumerate(acks)]
        return cls(queue_id=queue_id, claim_token=claim_token, acks=batch)


def _one(item: object, where: str) -> AckOne:
    if not isinstance(item, dict):
        raise BodyError(where, "must be an object")
    return AckOne.parse(item, where + ".")


@dataclass(frozen=True, slots=True)
class ReleaseBody(PlainBody):
    """A claimed message given back, and why."""

    queue_id: str
    claim_token: str
    reason: str | None = None

    @classmethod
    def parse(cls, data: Mapping[str, Any], where: str = "") -> Self:
        one = AckOne.parse(data, where)
        reason = _text(data, "reason", "reason", where, most=2000)
        return cls(queue_id=one.queue_id, claim_token=one.claim_token, reason=reason)
