"""The bodies of the routes a fleet calls all day (claim, ack, release), apart from every other
route's (functions/bodies.py): a poll or ack target's first request builds these few models, not all
of them, nor imports what the others check against (cold start, bench/README.md). Strict as the
others: a string where a number belongs is a 400, not a guess."""

from __future__ import annotations

from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

NIL = UUID(int=0)  # matches no row and no token: how a malformed id is judged


def loose_uuid(value: str) -> UUID:
    """An id we issued: a malformed one names nothing (404 / superseded), it is not a type error."""
    try:
        return UUID(value)
    except ValueError:
        return NIL


class Body(BaseModel):
    # Each model's validator is built on its first use, not at import: a route's first request
    # builds the one body it reads, not all of them (cold start, bench/README.md).
    model_config = ConfigDict(populate_by_name=True, extra="ignore", defer_build=True)


class ClaimBody(Body):
    max: StrictInt = Field(default=10, ge=1, le=100)
    wait_seconds: StrictInt = Field(default=0, ge=0, le=25, alias="waitSeconds")


class AckOne(Body):
    queue_id: StrictStr = Field(alias="queueId", max_length=100)
    claim_token: StrictStr = Field(alias="claimToken", max_length=100)


class AckBody(Body):
    queue_id: StrictStr | None = Field(default=None, alias="queueId", max_length=100)
    claim_token: StrictStr | None = Field(default=None, alias="claimToken", max_length=100)
    acks: list[AckOne] | None = Field(default=None, min_length=1, max_length=100)


class ReleaseBody(AckOne):
    reason: StrictStr | None = Field(default=None, max_length=2000)
