"""The queue's own records of a message, built on the wire's messages (`shared.wire.messages`): what
enqueue stores with the row (the message but what each claim adds), what it answers, and the request
every start carries by the time a machine claims it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from uuid import UUID

from shared.wire.messages import IssueRef, MessageKind, Prompt, Repository, Wire, start_request


@dataclass(frozen=True, slots=True)
class DispatchPayload(Wire):
    """What enqueue stores with the row: everything in a message that is not per-claim."""

    issue: IssueRef
    agent_session_id: str | None = None
    kind: MessageKind = "start"
    prompt: Prompt | None = None
    repository: Repository | None = None


@dataclass(frozen=True, slots=True)
class Enqueued(Wire):
    """What an enqueue wrote: the session, the queue row and the message."""

    session_id: UUID
    queue_id: UUID
    message_id: UUID
    notice_id: UUID | None = None  # the "Queued for <machine>" notice, when one was asked for and written


def with_request(kind: str, issue: IssueRef, prompt: Prompt | None) -> Prompt | None:
    """What a message asks, as its machine receives it: every start carries its request in
    `prompt.context` (Linear's `promptContext`, else `start_request`), plain assignments too."""
    if kind != "start" or (prompt is not None and prompt.context):
        return prompt
    context = start_request(issue, prompt.body if prompt is not None else None)
    return Prompt(context=context) if prompt is None else replace(prompt, context=context)
