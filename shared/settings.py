"""Settings from the environment, named and defaulted as the README's configuration section says.

Plain pydantic reads them: each field names its variable (`validation_alias`), matched in any case,
and values passed to `Settings(...)` win over the environment. (pydantic-settings did the same here
but imports every secret-manager and file source it supports on the way: about 30 ms of every
function instance's cold start, for a handful of variables.)
"""

from __future__ import annotations

import json
import os
from functools import cache, lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# pydantic looks for plugins when it builds its first model (the Settings below, in every process of
# ours) by reading the entry points of every installed distribution: about 25 M instructions of each
# cold start with the dev environment's 127 (bench/README.md, Cold start). We use none; whoever adds
# one sets PYDANTIC_DISABLE_PLUGINS themselves (empty: every plugin loads).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


class SettingsError(RuntimeError):
    """A configuration value is missing or malformed; the message names the variable."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="ignore")

    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    database_listen_url: str | None = Field(default=None, validation_alias="DATABASE_LISTEN_URL")
    # Set when DATABASE_URL points at PgBouncer/Supavisor in transaction mode: no server-side
    # prepared statements and no session state (statement timeouts are then set per transaction).
    database_transaction_pooler: bool = Field(default=False, validation_alias="DEVPILOT_TRANSACTION_POOLER")
    database_pool_max: int = Field(default=10, ge=1, le=200, validation_alias="DEVPILOT_POOL_MAX")
    # `devpilot serve`'s worker processes, each with its own pool (DEVPILOT_POOL_MAX connections)
    # and its own LISTEN connection; one of them runs the in-process sweep.
    serve_workers: int = Field(default=1, ge=1, le=64, validation_alias="DEVPILOT_SERVE_WORKERS")
    # Opening one database connection (libpq's connect_timeout: whole seconds, at least 2).
    connect_timeout_seconds: float = Field(
        default=5.0, gt=0, le=120, validation_alias="DEVPILOT_DB_CONNECT_TIMEOUT_SECONDS"
    )
    # When the database does not answer (docs/reliability.md): the client-side deadlines, each
    # covering the wait for a pooled connection and every statement sent on it; past one, the
    # request answers 503 db_unavailable and its connection is cut (shared.watchdog).
    # A request's database work, the webhook's included: within Linear's 5 s with room to spare.
    # A long-poll's is its waitSeconds plus this.
    request_deadline_seconds: float = Field(
        default=3.0, gt=0, le=60, validation_alias="DEVPILOT_REQUEST_DEADLINE_SECONDS"
    )
    # Each step of the sweep (re-queue, retention), and each database block of work that no
    # request bounds (Linear posts after a commit, the CLI).
    sweep_deadline_seconds: float = Field(
        default=30.0, gt=0, le=3600, validation_alias="DEVPILOT_SWEEP_DEADLINE_SECONDS"
    )
    # /healthz: its own connection, pinged within this whatever the database does (the rest of the
    # second the contract gives it is for the answer itself, on a loaded host).
    healthz_deadline_seconds: float = Field(
        default=0.5, gt=0, le=10, validation_alias="DEVPILOT_HEALTHZ_DEADLINE_SECONDS"
    )
    # Server-side limits on the service's sessions (bench/statements.py measures the slowest
    # statement they must leave room for; docs/reliability.md states the margins). The statement
    # limit sits under the request deadline, so a slow statement is cancelled by the server (its
    # connection kept) before the client has to cut the connection.
    statement_timeout_ms: int = Field(
        default=2000, ge=100, le=600_000, validation_alias="DEVPILOT_STATEMENT_TIMEOUT_MS"
    )
    lock_timeout_ms: int = Field(default=1500, ge=10, le=600_000, validation_alias="DEVPILOT_LOCK_TIMEOUT_MS")
    # Longer than the longest wait inside a transaction: a Linear token refresh holds the org's
    # credentials row across Linear's answer (DEVPILOT_LINEAR_TIMEOUT_SECONDS).
    idle_in_transaction_timeout_ms: int = Field(
        default=10_000, ge=100, le=3_600_000, validation_alias="DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS"
    )

    linear_webhook_secret: str | None = Field(default=None, validation_alias="LINEAR_WEBHOOK_SECRET")
    admin_token: str | None = Field(default=None, validation_alias="DEVPILOT_ADMIN_TOKEN")

    lease_seconds: int = Field(default=60, ge=1, le=86_400, validation_alias="DEVPILOT_LEASE_SECONDS")
    backoff_base_seconds: int = Field(
        default=60, ge=0, le=86_400, validation_alias="DEVPILOT_BACKOFF_BASE_SECONDS"
    )
    backoff_cap_seconds: int = Field(
        default=900, ge=0, le=604_800, validation_alias="DEVPILOT_BACKOFF_CAP_SECONDS"
    )
    max_attempts: int = Field(default=5, ge=1, le=1000, validation_alias="DEVPILOT_MAX_ATTEMPTS")
    reroute_after_seconds: int = Field(
        default=600, ge=0, le=30 * 86_400, validation_alias="DEVPILOT_REROUTE_AFTER_SECONDS"
    )
    webhook_tolerance_seconds: int = Field(
        default=60, ge=1, le=86_400, validation_alias="DEVPILOT_WEBHOOK_TOLERANCE_SECONDS"
    )
    # How long a webhook delivery's record is kept (0: for ever). The record is what makes Linear's
    # retry of it (about 1 min, 1 h, 6 h after the first attempt) a duplicate, so a day at least.
    delivery_retention_hours: int = Field(
        default=168, ge=0, le=87_600, validation_alias="DEVPILOT_DELIVERY_RETENTION_HOURS"
    )

    # Only on a sweep service that the platform itself protects (Cloud Run without unauthenticated
    # calls, reached by Cloud Scheduler's OIDC token): the platform has authenticated the caller.
    sweep_platform_auth: bool = Field(default=False, validation_alias="DEVPILOT_SWEEP_PLATFORM_AUTH")

    linear_api_url: str = Field(default="https://api.linear.app/graphql", validation_alias="LINEAR_API_URL")
    linear_timeout_seconds: float = Field(
        default=5.0, gt=0, le=60, validation_alias="DEVPILOT_LINEAR_TIMEOUT_SECONDS"
    )
    # Fernet keys for stored Linear tokens, comma-separated: the first encrypts, every one decrypts.
    encryption_keys: str | None = Field(default=None, validation_alias="DEVPILOT_ENCRYPTION_KEYS")
    # The Linear OAuth app (actor=app) that posts as the agent; unset -> OAuth install off.
    linear_client_id: str | None = Field(default=None, validation_alias="LINEAR_CLIENT_ID")
    linear_client_secret: str | None = Field(default=None, validation_alias="LINEAR_CLIENT_SECRET")
    public_url: str | None = Field(default=None, validation_alias="DEVPILOT_PUBLIC_URL")
    # This deployment's public URL per route (JSON), when each route has its own URL: handed to
    # machines at registration, as `devpilot-orchestrator --endpoints` takes it.
    endpoints: dict[str, str] | None = Field(default=None, validation_alias="DEVPILOT_ENDPOINTS")
    linear_oauth_authorize_url: str = Field(
        default="https://linear.app/oauth/authorize", validation_alias="LINEAR_OAUTH_AUTHORIZE_URL"
    )
    linear_oauth_token_url: str = Field(
        default="https://api.linear.app/oauth/token", validation_alias="LINEAR_OAUTH_TOKEN_URL"
    )
    linear_oauth_revoke_url: str = Field(
        default="https://api.linear.app/oauth/revoke", validation_alias="LINEAR_OAUTH_REVOKE_URL"
    )
    # The OAuth client people sign in with (actor=user, scope read) for /enroll and /me; unset ->
    # the agent app's client. Its redirect URI is <DEVPILOT_PUBLIC_URL>/enroll/callback.
    linear_signin_client_id: str | None = Field(default=None, validation_alias="LINEAR_SIGNIN_CLIENT_ID")
    linear_signin_client_secret: str | None = Field(
        default=None, validation_alias="LINEAR_SIGNIN_CLIENT_SECRET"
    )
    # The least confidence of Linear's repository suggestion that routes a start without asking.
    repository_confidence: float = Field(
        default=0.7, ge=0, le=1, validation_alias="DEVPILOT_REPOSITORY_CONFIDENCE"
    )
    metrics_enabled: bool = Field(default=False, validation_alias="DEVPILOT_METRICS")
    # An empty poll is logged at debug level unless this is set: an idle fleet's polls are most of
    # its requests, and on Cloud Run and Lambda every line is billed log ingestion.
    log_empty_polls: bool = Field(default=False, validation_alias="DEVPILOT_LOG_EMPTY_POLLS")

    supabase_url: str | None = Field(default=None, validation_alias="SUPABASE_URL")
    supabase_anon_key: str | None = Field(default=None, validation_alias="SUPABASE_ANON_KEY")
    supabase_jwt_secret: str | None = Field(default=None, validation_alias="SUPABASE_JWT_SECRET")
    supabase_jwt_private_key: str | None = Field(default=None, validation_alias="SUPABASE_JWT_PRIVATE_KEY")
    supabase_jwt_kid: str | None = Field(default=None, validation_alias="SUPABASE_JWT_KID")
    realtime_token_seconds: int = Field(
        default=600, ge=30, le=86_400, validation_alias="DEVPILOT_REALTIME_TOKEN_SECONDS"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_environment(cls, given: Any) -> Any:
        """The environment's value of each field's variable, under what the caller passed."""
        env = {name.upper(): value for name, value in os.environ.items()}
        found = {alias: env[alias] for alias in _variables(cls) if alias in env}
        return {**found, **given} if isinstance(given, dict) else given

    @field_validator("endpoints", mode="before")
    @classmethod
    def _json_map(cls, value: Any) -> Any:
        # A variable holds text; this one is a JSON object.
        return json.loads(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> Settings:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("DEVPILOT_BACKOFF_CAP_SECONDS must be >= DEVPILOT_BACKOFF_BASE_SECONDS")
        return self

    @model_validator(mode="after")
    def _idle_outlasts_linear(self) -> Settings:
        if self.idle_in_transaction_timeout_ms <= self.linear_timeout_seconds * 1000:
            raise ValueError(
                "DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS must exceed DEVPILOT_LINEAR_TIMEOUT_SECONDS: a "
                "token refresh waits for Linear inside its transaction"
            )
        return self

    @field_validator("delivery_retention_hours")
    @classmethod
    def _outlives_linears_retries(cls, value: int) -> int:
        if 0 < value < 24:
            raise ValueError("must be 0 (keep for ever) or at least 24: Linear retries for about 7 h")
        return value

    @property
    def webhook_secrets(self) -> list[str]:
        """LINEAR_WEBHOOK_SECRET's secrets: a workspace webhook and the OAuth app's webhook are
        signed with different ones, and a rotation has two at once (comma-separated)."""
        return [s.strip() for s in (self.linear_webhook_secret or "").split(",") if s.strip()]

    @property
    def oauth_enabled(self) -> bool:
        return bool(self.linear_client_id and self.linear_client_secret and self.public_url)

    @property
    def signin_client(self) -> tuple[str, str] | None:
        """The client id and secret people sign in with: LINEAR_SIGNIN_CLIENT_ID/SECRET when the id
        is set (both then, never half of one and half of the other), else the agent app's."""
        pair: tuple[str | None, str | None] = (
            (self.linear_signin_client_id, self.linear_signin_client_secret)
            if self.linear_signin_client_id
            else (self.linear_client_id, self.linear_client_secret)
        )
        return (pair[0], pair[1]) if pair[0] and pair[1] else None

    @property
    def signin_enabled(self) -> bool:
        return self.signin_client is not None and bool(self.public_url)

    @property
    def realtime_enabled(self) -> bool:
        signing = bool(self.supabase_jwt_secret) or bool(self.supabase_jwt_private_key)
        return bool(self.supabase_url and self.supabase_anon_key and signing)

    def backoff_seconds(self, attempt: int) -> int:
        """Delay before attempt n+1 after the n-th failed delivery: min(n² × base, cap)."""
        return min(attempt * attempt * self.backoff_base_seconds, self.backoff_cap_seconds)

    def retry_params(self) -> dict[str, int]:
        """The attempt limit and the backoff, as the statements that retry (`end_claims`,
        `notice_failed`) take them: `max_attempts`, and `base` and `cap` of min(n² × base, cap)."""
        return {
            "max_attempts": self.max_attempts,
            "base": self.backoff_base_seconds,
            "cap": self.backoff_cap_seconds,
        }


@cache
def _variables(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(str(f.validation_alias) for f in model.model_fields.values() if f.validation_alias)


def load_settings() -> Settings:
    """Read the environment now; a bad value raises SettingsError naming the variable."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "settings"
            problems.append(f"{loc}: {err['msg']}")
        raise SettingsError("invalid configuration: " + "; ".join(problems)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once; tests call get_settings.cache_clear())."""
    return load_settings()
