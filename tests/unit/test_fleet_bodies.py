"""The fleet's request bodies (claim, ack, release) are read by hand, not by pydantic (cold start):
they must accept and refuse exactly what the pydantic models they replaced did, with the same values.
The reference models below are those models, as they were (functions/fleet_bodies.py before
2026-12-06); hypothesis sends both the same JSON objects."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from functions.fleet_bodies import AckBody, BodyError, ClaimBody, PlainBody, ReleaseBody


class _Ref(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class RefClaim(_Ref):
    max: StrictInt = Field(default=10, ge=1, le=100)
    wait_seconds: StrictInt = Field(default=0, ge=0, le=25, alias="waitSeconds")


class RefAckOne(_Ref):
    queue_id: StrictStr = Field(alias="queueId", max_length=100)
    claim_token: StrictStr = Field(alias="claimToken", max_length=100)


class RefAck(_Ref):
    queue_id: StrictStr | None = Field(default=None, alias="queueId", max_length=100)
    claim_token: StrictStr | None = Field(default=None, alias="claimToken", max_length=100)
    acks: list[RefAckOne] | None = Field(default=None, min_length=1, max_length=100)


class RefRelease(RefAckOne):
    reason: StrictStr | None = Field(default=None, max_length=2000)


PAIRS: list[tuple[type[PlainBody], type[_Ref]]] = [
    (ClaimBody, RefClaim),
    (AckBody, RefAck),
    (ReleaseBody, RefRelease),
]

# Values at and around each rule's edges, of every JSON type (long strings and lists made by `map`,
# so a failure's report stays short).
_long = st.sampled_from([99, 100, 101, 1999, 2000, 2001]).map(lambda n: "x" * n)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([-1, 0, 1, 10, 25, 26, 100, 101, 1.0, 5.5, "5", "", "a"]),
    st.integers(-3, 130),
    st.text(max_size=3),
    _long,
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["queueId", "claimToken", "queue_id", "z"]), inner, max_size=3),
    ),
    max_leaves=6,
)
_ack_item = st.dictionaries(
    st.sampled_from(["queueId", "claimToken", "queue_id", "claim_token", "other"]), _values, max_size=4
)
_many = st.sampled_from([100, 101]).map(lambda n: [{"queueId": "q", "claimToken": "t"}] * n)
KEYS = [
    "max",
    "waitSeconds",
    "wait_seconds",
    "queueId",
    "queue_id",
    "claimToken",
    "claim_token",
    "reason",
    "x",
]
_bodies = st.dictionaries(
    st.sampled_from([*KEYS, "acks"]),
    st.one_of(_values, st.lists(st.one_of(_ack_item, _values), max_size=4), _many),
    max_size=5,
)


def _reference(ref: type[_Ref], body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return ref.model_validate(body).model_dump()
    except ValidationError:
        return None


def _plain(kind: type[PlainBody], body: dict[str, Any]) -> dict[str, Any] | None:
    try:
        parsed = kind.parse(body)
    except BodyError:
        return None
    out = {name: getattr(parsed, name) for name in parsed.__slots__}  # type: ignore[attr-defined]
    if out.get("acks") is not None:
        out["acks"] = [{"queue_id": a.queue_id, "claim_token": a.claim_token} for a in out["acks"]]
    return out


@settings(max_examples=1500, deadline=None)
@given(body=_bodies)
def test_each_fleet_body_accepts_and_refuses_what_pydantic_did(body: dict[str, Any]) -> None:
    for kind, ref in PAIRS:
        assert _plain(kind, body) == _reference(ref, body), (kind.__name__, body)


@pytest.mark.parametrize(
    ("kind", "body", "where"),
    [
        (ClaimBody, {"max": "5"}, "max: must be an integer"),
        (ClaimBody, {"max": True}, "max: must be an integer"),
        (ClaimBody, {"waitSeconds": 26}, "waitSeconds: must be from 0 to 25"),
        (AckBody, {"acks": []}, "acks: must hold 1 to 100"),
        (AckBody, {"queueId": 5, "acks": "x"}, "queueId: must be a string"),  # (pydantic's first fault)
        (AckBody, {"acks": [{"queueId": "q", "claimToken": "t"}, 3]}, "acks.1: must be an object"),
        (AckBody, {"acks": [{"queueId": "q"}]}, "acks.0.claimToken: is required"),
        (ReleaseBody, {"queueId": "q", "claimToken": "t", "reason": 1}, "reason: must be a string"),
    ],
)
def test_a_refused_body_names_its_field(kind: type[PlainBody], body: dict[str, Any], where: str) -> None:
    with pytest.raises(BodyError, match=f"^{where}"):
        kind.parse(body)


def test_the_defaults_and_both_names_of_a_field() -> None:
    assert ClaimBody.parse({}) == ClaimBody(max=10, wait_seconds=0)
    assert ClaimBody.parse({"wait_seconds": 3, "waitSeconds": 4}).wait_seconds == 4  # the wire name wins
    one = ReleaseBody.parse({"queue_id": "q", "claimToken": "t"})
    assert (one.queue_id, one.claim_token, one.reason) == ("q", "t", None)
