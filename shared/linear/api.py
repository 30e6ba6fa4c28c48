"""Reading from Linear's GraphQL API with an org's token (refreshed when Linear answers 401).

Only ever called after a commit (never inside a webhook's transaction or its 5 s), by the steps
that must ask Linear something before they can act: routing an automation's agent session to the
issue's assignee, and the steps that later issues add beside it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from shared.linear import auth as linear_auth
from shared.plumbing import crypto
from shared.plumbing.db import Pool
from shared.plumbing.settings import Settings

if TYPE_CHECKING:
    import httpx

_clients: dict[tuple[int, float], httpx.Client] = {}
_clients_lock = threading.Lock()


def client(settings: Settings) -> httpx.Client:
    """The process's HTTP client for Linear's API (one per timeout; thread-safe, kept open so its
    connections are reused): making a client builds a TLS context, which costs more CPU than the
    call itself, so it is not made again for every read and every batch of notices."""
    import httpx  # (here, not at the top: see shared.linear.auth)

    key = (os.getpid(), settings.linear_timeout_seconds)  # (a forked worker makes its own)
    with _clients_lock:
        made = _clients.get(key)
        if made is None:
            made = _clients[key] = httpx.Client(timeout=key[1])
        return made


class NotConnected(Exception):
    """The org has no working Linear connection (none stored, or disconnected)."""


class Unavailable(Exception):
    """Linear could not be asked, or did not answer the question: try again later."""


class Refused(Exception):
    """Linear answered, and not with what was asked (an HTTP error, `errors`, no data): its words."""


class RateLimited(Refused, Unavailable):
    """Linear refused the call for its rate limit (`RATELIMITED`): not an attempt; nothing of the
    org is sent before `seconds` from now, when Linear said its budget refills (`reset_in`).
    A Refused and an Unavailable, so a caller that knows neither takes it as before."""

    def __init__(self, detail: str, seconds: float, budget: str) -> None:
        super().__init__(detail)
        self.seconds, self.budget = seconds, budget


# Linear's rate limits (docs/linear-rate-limits.md): a refused call is answered HTTP 400 (429 from
# some proxies and older answers) with a GraphQL error whose `extensions.code` is `RATELIMITED`;
# each budget's headers say what remains and when it refills, as UTC epoch milliseconds.
BUDGETS = (
    ("requests", "X-RateLimit-Requests-Remaining", "X-RateLimit-Requests-Reset"),
    ("complexity", "X-RateLimit-Complexity-Remaining", "X-RateLimit-Complexity-Reset"),
    ("endpoint", "X-RateLimit-Endpoint-Requests-Remaining", "X-RateLimit-Endpoint-Requests-Reset"),
)
DEFAULT_WAIT_SECONDS = 60.0  # a refusal that names no reset
LONGEST_WAIT_SECONDS = 3600.0  # Linear's budgets are hourly: a reset further away is not believed


def rate_limited(status: int, answer: Any) -> bool:
    """Whether Linear's answer is its rate limit's refusal."""
    if status == 429:
        return True
    errors = answer.get("errors") if isinstance(answer, dict) else None
    for error in errors if isinstance(errors, list) else []:
        extensions = (error.get("extensions") if isinstance(error, dict) else None) or {}
        if not isinstance(extensions, dict):
            continue
        if str(extensions.get("code") or "").upper() == "RATELIMITED":
            return True
        if str(extensions.get("type") or "").lower() == "ratelimited":  # (what Linear's SDK reads)
            return True
    return False


def reset_in(headers: Any, now: float | None = None) -> tuple[float, str]:
    """How long to wait, in seconds, and which budget ran out, from a refusal's headers: the
    latest reset among the budgets with nothing remaining (or, when none says so, among all those
    given); `Retry-After` (seconds) when Linear sends it. Bounded to [1 s, 1 h]."""
    now = time.time() if now is None else now
    retry_after = _number(headers.get("Retry-After"))
    if retry_after is not None:
        return _bounded(retry_after), "retry-after"
    resets: list[tuple[float, str, bool]] = []
    for budget, remaining_header, reset_header in BUDGETS:
        reset = _number(headers.get(reset_header))
        if reset is None:
            continue
        at = reset / 1000 if reset > 1e11 else reset  # (milliseconds, as documented; seconds tolerated)
        remaining = _number(headers.get(remaining_header))
        name = str(headers.get("X-RateLimit-Endpoint-Name") or budget) if budget == "endpoint" else budget
        resets.append((at - now, name, remaining is not None and remaining <= 0))
    spent = [r for r in resets if r[2]] or resets
    if not spent:
        return DEFAULT_WAIT_SECONDS, "unknown"
    wait, name, _ = max(spent)
    return _bounded(wait), name


def _bounded(seconds: float) -> float:
    return min(max(seconds, 1.0), LONGEST_WAIT_SECONDS)


def _number(value: Any) -> float | None:
    try:
        n = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) else None


def ask(
    http: httpx.Client,
    settings: Settings,
    tokens: linear_auth.Tokens,
    org_id: str,
    document: str,
    variables: dict[str, Any],
) -> dict[str, Any]:
    """The `data` of one GraphQL request with the org's token (from `tokens`, which a caller may
    share across many requests): a 401 refreshes the token once and asks again. Raises NotConnected
    (no connection, or Linear refused the refresh) or Refused; a failure to reach Linear is httpx's."""
    token = tokens.get(org_id)
    if token is None:
        raise NotConnected("no Linear connection for this org (or it was disconnected)")
    body = {"query": document, "variables": variables}
    r = _post(http, settings, body, token)
    if r.status_code == 401:  # expired or revoked: refresh once, then ask again
        token = tokens.refused(org_id)
        if token is None:
            raise NotConnected("Linear refused the refresh: the org is disconnected")
        r = _post(http, settings, body, token)
    answer = _json(r)
    if rate_limited(r.status_code, answer):
        seconds, budget = reset_in(r.headers)
        raise RateLimited(f"Linear's rate limit ({budget}): waiting {seconds:.0f} s", seconds, budget)
    if r.status_code != 200:
        raise Refused(f"Linear answered HTTP {r.status_code}: {r.text[:300]}")
    if not isinstance(answer, dict) or answer.get("errors") or not isinstance(answer.get("data"), dict):
        raise Refused(
            f"Linear refused: {str(answer.get('errors') if isinstance(answer, dict) else answer)[:300]}"
        )
    data: dict[str, Any] = answer["data"]
    return data


def graphql(pool: Pool, settings: Settings, org_id: str, document: str, variables: dict[str, Any]) -> Any:
    """`ask`, for a step that reads once and tries again later: raises NotConnected or
    Unavailable (RateLimited, an Unavailable, for Linear's rate limit); never anything else for
    Linear's answers."""
    import httpx  # (here, not at the top: see shared.linear.auth)

    try:
        return ask(
            client(settings), settings, linear_auth.Tokens(pool, settings), org_id, document, variables
        )
    except RateLimited:
        raise
    except (Refused, httpx.HTTPError, ValueError, crypto.InvalidToken, linear_auth.RefreshFailed) as exc:
        raise Unavailable(f"{type(exc).__name__}: {exc}"[:300]) from None


def _json(r: Any) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _post(http: Any, settings: Settings, body: dict[str, Any], token: str) -> Any:
    return http.post(
        settings.linear_api_url,
        json=body,
        headers={"Authorization": linear_auth.authorization(token), "Content-Type": "application/json"},
    )
