"""Settings from the environment, named and defaulted as the README's configuration section says.

Plain Python, not pydantic: every target's first request reads these, and importing pydantic is
a large part of each cloud function's cold start (bench/README.md, "Cold start"). Each field names its variable (`var`), matched in any
case in the environment, and values passed to `Settings(...)` win over the environment.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_VAR = "devpilot.variable"  # the key of a field's metadata that holds its Var


class SettingsError(RuntimeError):
    """A configuration value is missing or malformed; the message names the variable."""


# What pydantic's lax mode took for each type, as environment variables spell it: an integer may
# carry a zero fraction ("10.0"), a boolean is one of these words in any case.
_INTEGER = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_BOOLEANS = {
    **dict.fromkeys(("true", "1", "yes", "on", "t", "y"), True),
    **dict.fromkeys(("false", "0", "no", "off", "f", "n"), False),
}


def _int(raw: object) -> int:
    if isinstance(raw, int):
        return int(raw)  # (a bool is 0 or 1, as pydantic took it)
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()):
        return int(raw.strip().partition(".")[0])
    raise ValueError("not an integer")


def _float(raw: object) -> float:
    if isinstance(raw, int | float):
        return float(raw)
    if isinstance(raw, str) and raw.isascii():  # (float() would take other scripts' digits)
        try:
            return float(raw)
        except ValueError:
            pass
    raise ValueError("not a number")


def _bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int | float) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.lower() in _BOOLEANS:
        return _BOOLEANS[raw.lower()]
    raise ValueError("not a boolean (true/false, 1/0, yes/no, on/off, t/f, y/n)")


def _text(raw: object) -> str:
    if isinstance(raw, str):
        return raw  # as given: "" stays "" (a set but empty variable is not an unset one)
    raise ValueError("not a string")


def _optional_text(raw: object) -> str | None:
    return None if raw is None else _text(raw)


def _json_object(raw: object) -> dict[str, str] | None:
    """A JSON object of strings (a variable holds text; `Settings(...)` may be given the dict)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    if raw is None:
        return None
    if isinstance(raw, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        return dict(raw)
    raise ValueError("not a JSON object of strings")


# The conversion of a variable whose default is of this type (None: an optional string).
_PARSERS: dict[type, Callable[[object], Any]] = {
    bool: _bool,
    int: _int,
    float: _float,
    str: _text,
    type(None): _optional_text,
}


@dataclass(frozen=True)
class Var(Generic[T]):
    """A field's variable: its name, its conversion from what is given or set, and its bounds."""

    name: str
    parse: Callable[[object], T]
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    check: Callable[[T], None] | None = None

    def read(self, raw: object) -> T:
        """The value of `raw`, converted and checked; ValueError says what is wrong."""
        value = self.parse(raw)
        if isinstance(value, int | float):
            # (`not >=`: NaN is within no bounds)
            if self.ge is not None and not value >= self.ge:
                raise ValueError(f"must be >= {self.ge}")
            if self.gt is not None and not value > self.gt:
                raise ValueError(f"must be > {self.gt}")
            if self.le is not None and not value <= self.le:
                raise ValueError(f"must be <= {self.le}")
        if self.check is not None:
            self.check(value)
        return value


def var(
    name: str,
    default: T,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    parse: Callable[[object], T] | None = None,
    check: Callable[[T], None] | None = None,
) -> T:
    """A field read from the variable `name`. Its conversion is chosen by the default's type (so a
    float's default is written 5.0, not 5), unless `parse` is given."""
    spec: Var[T] = Var(name, parse or _PARSERS[type(default)], ge=ge, gt=gt, le=le, check=check)
    return field(default=default, metadata={_VAR: spec})


def _outlives_linears_retries(hours: int) -> None:
    if 0 < hours < 24:
        raise ValueError("must be 0 (keep for ever) or at least 24: Linear retries for about 7 h")


@dataclass(frozen=True, init=False)
class Settings:
    """The service's settings, each field read from its variable (`var`)."""

    # Not hashable, as the pydantic model was not: `endpoints` is a dict, so a hash (a cache keyed
    # by the settings) would work only where DEVPILOT_ENDPOINTS is unset.
    __hash__ = None  # type: ignore[assignment]

    database_url: str | None = var("DATABASE_URL", None)
    database_listen_url: str | None = var("DATABASE_LISTEN_URL", None)
    # Set when DATABASE_URL points at PgBouncer/Supavisor in transaction mode: no server-side
    # prepared statements and no session state (statement timeouts are then set per transaction).
    database_transaction_pooler: bool = var("DEVPILOT_TRANSACTION_POOLER", False)
    database_pool_max: int = var("DEVPILOT_POOL_MAX", 10, ge=1, le=200)
    # `devpilot serve`'s worker processes, each with its own pool (DEVPILOT_POOL_MAX connections)
    # and its own LISTEN connection; one of them runs the in-process sweep.
    serve_workers: int = var("DEVPILOT_SERVE_WORKERS", 1, ge=1, le=64)
    # Opening one database connection (libpq's connect_timeout: whole seconds, at least 2).
    connect_timeout_seconds: float = var("DEVPILOT_DB_CONNECT_TIMEOUT_SECONDS", 5.0, gt=0, le=120)
    # When the database does not answer (docs/reliability.md): the client-side deadlines, each
    # covering the wait for a pooled connection and every statement sent on it; past one, the
    # request answers 503 db_unavailable and its connection is cut (shared.plumbing.watchdog).
    # A request's database work, the webhook's included: within Linear's 5 s with room to spare.
    # A long-poll's is its waitSeconds plus this.
    request_deadline_seconds: float = var("DEVPILOT_REQUEST_DEADLINE_SECONDS", 3.0, gt=0, le=60)
    # Each step of the sweep (re-queue, retention), and each database block of work that no
    # request bounds (Linear posts after a commit, the CLI).
    sweep_deadline_seconds: float = var("DEVPILOT_SWEEP_DEADLINE_SECONDS", 30.0, gt=0, le=3600)
    # /healthz: its own connection, pinged within this whatever the database does (the rest of the
    # second the contract gives it is for the answer itself, on a loaded host).
    healthz_deadline_seconds: float = var("DEVPILOT_HEALTHZ_DEADLINE_SECONDS", 0.5, gt=0, le=10)
    # Server-side limits on the service's sessions (bench/statements.py measures the slowest
    # statement they must leave room for; docs/reliability.md states the margins). The statement
    # limit sits under the request deadline, so a slow statement is cancelled by the server (its
    # connection kept) before the client has to cut the connection.
    statement_timeout_ms: int = var("DEVPILOT_STATEMENT_TIMEOUT_MS", 2000, ge=100, le=600_000)
    lock_timeout_ms: int = var("DEVPILOT_LOCK_TIMEOUT_MS", 1500, ge=10, le=600_000)
    # Longer than the longest wait inside a transaction: a Linear token refresh holds the org's
    # credentials row across Linear's answer (DEVPILOT_LINEAR_TIMEOUT_SECONDS).
    idle_in_transaction_timeout_ms: int = var(
        "DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS", 10_000, ge=100, le=3_600_000
    )

    linear_webhook_secret: str | None = var("LINEAR_WEBHOOK_SECRET", None)
    admin_token: str | None = var("DEVPILOT_ADMIN_TOKEN", None)

    lease_seconds: int = var("DEVPILOT_LEASE_SECONDS", 60, ge=1, le=86_400)
    backoff_base_seconds: int = var("DEVPILOT_BACKOFF_BASE_SECONDS", 60, ge=0, le=86_400)
    backoff_cap_seconds: int = var("DEVPILOT_BACKOFF_CAP_SECONDS", 900, ge=0, le=604_800)
    max_attempts: int = var("DEVPILOT_MAX_ATTEMPTS", 5, ge=1, le=1000)
    reroute_after_seconds: int = var("DEVPILOT_REROUTE_AFTER_SECONDS", 600, ge=0, le=30 * 86_400)
    webhook_tolerance_seconds: int = var("DEVPILOT_WEBHOOK_TOLERANCE_SECONDS", 60, ge=1, le=86_400)
    # How long a webhook delivery's record is kept (0: for ever). The record is what makes Linear's
    # retry of it (about 1 min, 1 h, 6 h after the first attempt) a duplicate, so a day at least.
    delivery_retention_hours: int = var(
        "DEVPILOT_DELIVERY_RETENTION_HOURS", 168, ge=0, le=87_600, check=_outlives_linears_retries
    )
    # How long a finished conversation is kept after its last change (0: for ever): the sweep then
    # forgets it, with every post, record and routing request of it (shared/operators/retention.py).
    retention_days: int = var("DEVPILOT_RETENTION_DAYS", 90, ge=0, le=36_500)

    # Only on a sweep service that the platform itself protects (Cloud Run without unauthenticated
    # calls, reached by Cloud Scheduler's OIDC token): the platform has authenticated the caller.
    sweep_platform_auth: bool = var("DEVPILOT_SWEEP_PLATFORM_AUTH", False)

    linear_api_url: str = var("LINEAR_API_URL", "https://api.linear.app/graphql")
    linear_timeout_seconds: float = var("DEVPILOT_LINEAR_TIMEOUT_SECONDS", 5.0, gt=0, le=60)
    # Fernet keys for stored Linear tokens, comma-separated: the first encrypts, every one decrypts.
    encryption_keys: str | None = var("DEVPILOT_ENCRYPTION_KEYS", None)
    # The Linear OAuth app (actor=app) that posts as the agent; unset -> OAuth install off.
    linear_client_id: str | None = var("LINEAR_CLIENT_ID", None)
    linear_client_secret: str | None = var("LINEAR_CLIENT_SECRET", None)
    public_url: str | None = var("DEVPILOT_PUBLIC_URL", None)
    # This deployment's public URL per route (JSON), when each route has its own URL: handed to
    # machines at registration, as `devpilot-orchestrator --endpoints` takes it. (RUF009: the
    # default is None, no dict that instances would share.)
    endpoints: dict[str, str] | None = var("DEVPILOT_ENDPOINTS", None, parse=_json_object)  # noqa: RUF009
    linear_oauth_authorize_url: str = var("LINEAR_OAUTH_AUTHORIZE_URL", "https://linear.app/oauth/authorize")
    linear_oauth_token_url: str = var("LINEAR_OAUTH_TOKEN_URL", "https://api.linear.app/oauth/token")
    linear_oauth_revoke_url: str = var("LINEAR_OAUTH_REVOKE_URL", "https://api.linear.app/oauth/revoke")
    # The OAuth client people sign in with (actor=user, scope read) for /enroll and /me; unset ->
    # the agent app's client. Its redirect URI is <DEVPILOT_PUBLIC_URL>/enroll/callback.
    linear_signin_client_id: str | None = var("LINEAR_SIGNIN_CLIENT_ID", None)
    linear_signin_client_secret: str | None = var("LINEAR_SIGNIN_CLIENT_SECRET", None)
    # The least confidence of Linear's repository suggestion that routes a start without asking.
    repository_confidence: float = var("DEVPILOT_REPOSITORY_CONFIDENCE", 0.7, ge=0, le=1)
    metrics_enabled: bool = var("DEVPILOT_METRICS", False)
    # An empty poll is logged at debug level unless this is set: an idle fleet's polls are most of
    # its requests, and on Cloud Run and Lambda every line is billed log ingestion.
    log_empty_polls: bool = var("DEVPILOT_LOG_EMPTY_POLLS", False)

    supabase_url: str | None = var("SUPABASE_URL", None)
    supabase_anon_key: str | None = var("SUPABASE_ANON_KEY", None)
    supabase_jwt_secret: str | None = var("SUPABASE_JWT_SECRET", None)
    supabase_jwt_private_key: str | None = var("SUPABASE_JWT_PRIVATE_KEY", None)
    supabase_jwt_kid: str | None = var("SUPABASE_JWT_KID", None)
    realtime_token_seconds: int = var("DEVPILOT_REALTIME_TOKEN_SECONDS", 600, ge=30, le=86_400)

    def __init__(self, **given: object) -> None:
        """Each variable's value from `given` (by the variable's name), else from the environment
        (its name in any case), else its default. Unknown names are ignored; every bad value is
        reported at once, in a SettingsError. A field's own name is refused: it is a mistake
        (`dataclasses.replace` passes them, and would otherwise read every value afresh from the
        environment, the change and the given values lost; `replace` below is the way)."""
        attributes = sorted(given.keys() & {f.name for f in fields(self)})
        if attributes:
            raise TypeError(f"Settings takes variables' names (DEVPILOT_POOL_MAX=...), not {attributes}")
        env = {name.upper(): value for name, value in os.environ.items()}
        problems: list[str] = []
        for f in fields(self):
            spec: Var[object] = f.metadata[_VAR]
            try:
                if spec.name in given:
                    value = spec.read(given[spec.name])
                elif spec.name in env:
                    value = spec.read(env[spec.name])
                else:
                    value = f.default
            except ValueError as exc:
                problems.append(f"{spec.name}: {exc}")
                continue
            object.__setattr__(self, f.name, value)  # (frozen: nothing changes them afterwards)
        if not problems:  # (the checks between variables need every one of them)
            problems = self._disagreements()
        if problems:
            raise SettingsError("invalid configuration: " + "; ".join(problems))

    def _disagreements(self) -> list[str]:
        problems = []
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            problems.append("DEVPILOT_BACKOFF_CAP_SECONDS: must be >= DEVPILOT_BACKOFF_BASE_SECONDS")
        if self.idle_in_transaction_timeout_ms <= self.linear_timeout_seconds * 1000:
            problems.append(
                "DEVPILOT_IDLE_IN_TRANSACTION_TIMEOUT_MS: must exceed DEVPILOT_LINEAR_TIMEOUT_SECONDS: a "
                "token refresh waits for Linear inside its transaction"
            )
        return problems

    @classmethod
    def defaults(cls) -> dict[str, object]:
        """Each variable's name and its default (docs/configuration.md's table states them)."""
        return {f.metadata[_VAR].name: f.default for f in fields(cls)}

    def replace(self, **changes: object) -> Settings:
        """A copy with these fields (by attribute name) changed, each checked as its variable is."""
        variables = {f.name: f.metadata[_VAR].name for f in fields(self)}
        unknown = sorted(set(changes) - set(variables))
        if unknown:
            raise TypeError(f"Settings has no fields {unknown}")
        # Every variable given: the environment has no say in the copy.
        return type(self)(**{variables[n]: changes.get(n, getattr(self, n)) for n in variables})

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

    def retry_params(self) -> dict[str, int]:
        """The attempt limit and the backoff, as the statements that retry (`end_claims`,
        `notice_failed`) take them: `max_attempts`, and `base` and `cap` of min(n² × base, cap)."""
        return {
            "max_attempts": self.max_attempts,
            "base": self.backoff_base_seconds,
            "cap": self.backoff_cap_seconds,
        }


def load_settings() -> Settings:
    """Read the environment now; a bad value raises SettingsError naming the variable."""
    return Settings()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (read once; tests call get_settings.cache_clear())."""
    return load_settings()
