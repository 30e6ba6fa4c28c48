"""Reading from Linear's GraphQL API with an org's token (refreshed when Linear answers 401).

Only ever called after a commit (never inside a webhook's transaction or its 5 s), by the steps
that must ask Linear something before they can act: routing an automation's agent session to the
issue's assignee, and the steps that later issues add beside it.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from shared import crypto, linear_auth
from shared.db import Pool
from shared.settings import Settings

if TYPE_CHECKING:
    import httpx

_clients: dict[tuple[int, float], httpx.Client] = {}
_clients_lock = threading.Lock()


def client(settings: Settings) -> httpx.Client:
    """The process's HTTP client for Linear's API (one per timeout; thread-safe, kept open so its
    connections are reused): making a client builds a TLS context, which took 70 ms of CPU on a
    busy 2-core host, more than the call itself, on every read and every batch of notices."""
    import httpx  # (here, not at the top: see shared.linear_auth)

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
    if r.status_code != 200:
        raise Refused(f"Linear answered HTTP {r.status_code}: {r.text[:300]}")
    answer = r.json()
    if not isinstance(answer, dict) or answer.get("errors") or not isinstance(answer.get("data"), dict):
        raise Refused(
            f"Linear refused: {str(answer.get('errors') if isinstance(answer, dict) else answer)[:300]}"
        )
    data: dict[str, Any] = answer["data"]
    return data


def graphql(pool: Pool, settings: Settings, org_id: str, document: str, variables: dict[str, Any]) -> Any:
    """`ask`, for a step that reads once and tries again later: raises NotConnected or
    Unavailable; never anything else for Linear's answers."""
    import httpx  # (here, not at the top: see shared.linear_auth)

    try:
        return ask(
            client(settings), settings, linear_auth.Tokens(pool, settings), org_id, document, variables
        )
    except (Refused, httpx.HTTPError, ValueError, crypto.InvalidToken, linear_auth.RefreshFailed) as exc:
        raise Unavailable(f"{type(exc).__name__}: {exc}"[:300]) from None


def _post(http: Any, settings: Settings, body: dict[str, Any], token: str) -> Any:
    return http.post(
        settings.linear_api_url,
        json=body,
        headers={"Authorization": linear_auth.authorization(token), "Content-Type": "application/json"},
    )
