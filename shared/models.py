"""The messages the contract fixes, as pydantic models (camelCase on the wire)."""

from __future__ import annotations

import os
import re
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

# pydantic looks for plugins when it builds its first model by reading the entry points of every
# installed distribution: about 25 M instructions of each cold start with the dev environment's 127
# (bench/README.md, Cold start). We use none; whoever adds one sets PYDANTIC_DISABLE_PLUGINS
# themselves (empty: every plugin loads). Set before pydantic is imported, here and in
# functions/bodies.py: every process that builds a model has imported one of the two by then.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Wire(BaseModel):
    # Built on first use, not at import: a poll that finds nothing never builds a message's model.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, defer_build=True)


class IssueRef(Wire):
    id: str
    identifier: str | None = None
    title: str | None = None
    url: str | None = None
    description: str | None = None


MessageKind = Literal["start", "prompt", "stop"]


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


class Repository(Wire):
    """A repository a message is about: the host and `owner/name`."""

    hostname: str
    full_name: str


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


class DispatchPayload(Wire):
    """What enqueue stores with the row: everything in a message that is not per-claim."""

    issue: IssueRef
    agent_session_id: str | None = None
    kind: MessageKind = "start"
    prompt: Prompt | None = None
    repository: Repository | None = None


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
    repository: Repository | None = None

    def wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


class Enqueued(Wire):
    session_id: UUID
    queue_id: UUID
    message_id: UUID
    notice_id: UUID | None = None  # the "Queued for <machine>" notice, when one was asked for and written
