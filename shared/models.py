"""The messages the contract fixes, as pydantic models (camelCase on the wire)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class IssueRef(Wire):
    id: str
    identifier: str | None = None
    title: str | None = None
    url: str | None = None
    description: str | None = None


MessageKind = Literal["start", "prompt", "stop"]


class Prompt(Wire):
    """What the user asked (`body`), and Linear's formatted context for agents (`start` only)."""

    body: str | None = None
    context: str | None = None


class DispatchPayload(Wire):
    """What enqueue stores with the row: everything in a message that is not per-claim."""

    issue: IssueRef
    agent_session_id: str | None = None
    kind: MessageKind = "start"
    prompt: Prompt | None = None


class TaskDispatchMessage(Wire):
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

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


class Enqueued(Wire):
    session_id: UUID
    queue_id: UUID
    message_id: UUID
    notice_id: UUID | None = None  # the "Queued for <machine>" notice, when one was asked for and written
