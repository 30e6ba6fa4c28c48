"""Request bodies of the routes (strict: a string where a number belongs is a 400, not a guess). The
fleet's own (claim, ack, release) are in functions/fleet_bodies.py, read without pydantic."""

from __future__ import annotations

import os
from typing import Any, Literal
from urllib.parse import urlsplit

# pydantic looks for plugins when it builds its first model by reading the entry points of every
# installed distribution, on every cold start (bench/README.md, Cold start). We use none; whoever
# adds one sets PYDANTIC_DISABLE_PLUGINS themselves (empty: every plugin loads). Set before
# pydantic is imported: the service builds pydantic models only here (functions/web.py imports
# pydantic for these models alone).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from pydantic import (
    UUID4,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from functions.fleet_bodies import loose_uuid as loose_uuid
from shared.dispatch import machines
from shared.wire.messages import FULL_NAME, HOSTNAME, LABEL


class Body(BaseModel):
    # Each model's validator is built on its first use, not at import: a route's first request
    # builds the one body it reads, not all of them (cold start, bench/README.md).
    model_config = ConfigDict(populate_by_name=True, extra="ignore", defer_build=True)


class RepositoryIn(Body):
    """A repository a machine has: its Git host and `owner/name` (as Linear names repositories)."""

    hostname: StrictStr = Field(min_length=1, max_length=255)
    full_name: StrictStr = Field(alias="fullName", min_length=3, max_length=200)

    @field_validator("hostname")
    @classmethod
    def _host(cls, v: str) -> str:
        v = v.strip().lower()
        if not HOSTNAME.match(v):
            raise ValueError("must be a host name, such as github.com")
        return v

    @field_validator("full_name")
    @classmethod
    def _owner_name(cls, v: str) -> str:
        v = v.strip()
        if not FULL_NAME.match(v):
            raise ValueError("must be owner/name, such as acme/backend")
        return v


class MachineBody(Body):
    repositories: list[RepositoryIn] = Field(default_factory=list, max_length=machines.MAX_REPOSITORIES)
    labels: list[StrictStr] = Field(default_factory=list, max_length=machines.MAX_LABELS)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        if not all(LABEL.match(label.strip()) for label in v):
            raise ValueError("each label must be 1 to 64 printable characters")
        return v


class RegisterBody(Body):
    org_id: StrictStr = Field(alias="orgId", min_length=1, max_length=200)
    linear_user_id: StrictStr = Field(alias="linearUserId", min_length=1, max_length=200)
    name: StrictStr = Field(min_length=1, max_length=200)

    @field_validator("org_id", "linear_user_id", "name")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v


class CredentialsBody(Body):
    org_id: StrictStr = Field(alias="orgId", min_length=1, max_length=200)
    access_token: StrictStr = Field(alias="accessToken", min_length=1, max_length=4000)


class ActivityContent(Body):
    """Linear's agent activity content: `action` needs action and parameter; the others a body."""

    type: Literal["thought", "action", "elicitation", "response", "error"]
    body: StrictStr | None = Field(default=None, max_length=100_000)
    action: StrictStr | None = Field(default=None, max_length=2000)
    parameter: StrictStr | None = Field(default=None, max_length=100_000)
    result: StrictStr | None = Field(default=None, max_length=100_000)

    @model_validator(mode="after")
    def _complete(self) -> ActivityContent:
        if self.type == "action":
            if self.action is None or self.parameter is None:
                raise ValueError("an action needs 'action' and 'parameter'")
        elif self.body is None or not self.body.strip():
            raise ValueError(f"a {self.type} needs a non-empty 'body'")
        return self

    def linear(self) -> dict[str, str]:
        """As Linear's agentActivityCreate takes it: only the fields this type has."""
        return self.model_dump(exclude_none=True)


class SelectOption(Body):
    label: StrictStr | None = Field(default=None, min_length=1, max_length=200)
    value: StrictStr = Field(min_length=1, max_length=1000)


class ActivityBody(Body):
    """An activity as Linear's AgentActivityCreateInput takes it. An elicitation may carry one of
    the agent's signals: `select` (signalMetadata `{"options": [{"label"?, "value"}]}`: the person
    picks one, and the choice comes back as a follow-up with the `select` signal) or `auth`
    (signalMetadata `{"url", "providerName"?}`: a link to connect an account)."""

    agent_session_id: StrictStr = Field(alias="agentSessionId", min_length=1, max_length=200)
    content: ActivityContent
    id: UUID4 | None = None
    ephemeral: StrictBool = False
    signal: Literal["select", "auth"] | None = None
    signal_metadata: dict[str, Any] | None = Field(default=None, alias="signalMetadata")

    @model_validator(mode="after")
    def _signal_fits(self) -> ActivityBody:
        if self.signal is None:
            if self.signal_metadata is not None:
                raise ValueError("'signalMetadata' needs a 'signal'")
            return self
        if self.content.type != "elicitation":
            raise ValueError(f"the {self.signal} signal is for an elicitation")
        meta = self.signal_metadata or {}
        if self.signal == "select":
            options = meta.get("options")
            if not isinstance(options, list) or not 1 <= len(options) <= 50:
                raise ValueError("a select needs signalMetadata.options: 1 to 50 options")
            parsed = [SelectOption.model_validate(o) for o in options]
            self.signal_metadata = {"options": [o.model_dump(exclude_none=True) for o in parsed]}
        else:
            url, provider = meta.get("url"), meta.get("providerName")
            if not isinstance(url, str) or len(url) > 2000 or urlsplit(url).scheme not in ("https", "http"):
                raise ValueError("an auth signal needs signalMetadata.url, an http(s) URL")
            if provider is not None and (not isinstance(provider, str) or len(provider) > 200):
                raise ValueError("signalMetadata.providerName must be a short string")
            self.signal_metadata = {"url": url, **({"providerName": provider} if provider else {})}
        return self


PKCE = r"^[A-Za-z0-9._~-]{43,128}$"  # RFC 7636 §4.1: a verifier (and an S256 challenge is 43 of these)


class EnrollBody(BaseModel):
    """`POST /enroll/sessions`. Unknown fields are refused: there is no redirect address to give
    (the loopback address is built from the port), and a client that sends one is told so."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", defer_build=True)

    name: StrictStr = Field(min_length=1, max_length=200)
    code_challenge: StrictStr = Field(alias="codeChallenge", pattern=PKCE)
    code_challenge_method: Literal["S256"] = Field(alias="codeChallengeMethod")
    loopback_port: StrictInt | None = Field(default=None, alias="loopbackPort", ge=1024, le=65535)
    mode: Literal["loopback", "code"] = "loopback"

    @field_validator("name")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @model_validator(mode="after")
    def _port_for_loopback(self) -> EnrollBody:
        if self.mode == "loopback" and self.loopback_port is None:
            raise ValueError('loopbackPort (1024..65535) is required, or "mode": "code"')
        if self.mode == "code" and self.loopback_port is not None:
            raise ValueError("a code-mode enrollment has no loopbackPort")
        return self


class EnrollTokenBody(Body):
    enroll_id: StrictStr = Field(alias="enrollId", min_length=1, max_length=100)
    code_verifier: StrictStr = Field(alias="codeVerifier", pattern=PKCE)
    code: StrictStr | None = Field(default=None, min_length=1, max_length=200)


class PlanStep(Body):
    """One step of the agent's plan, as Linear shows it (agent-interaction, "Agent plans")."""

    content: StrictStr = Field(min_length=1, max_length=2000)
    status: Literal["pending", "inProgress", "completed", "canceled"]


class PlanBody(Body):
    """The agent's whole plan: it replaces the one before (Linear keeps no partial updates)."""

    agent_session_id: StrictStr = Field(alias="agentSessionId", min_length=1, max_length=200)
    plan: list[PlanStep] = Field(min_length=1, max_length=100)


class MoveBody(Body):
    orchestrator_id: StrictStr = Field(alias="orchestratorId", min_length=1, max_length=100)
