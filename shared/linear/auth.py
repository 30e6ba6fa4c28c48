"""An org's connection to Linear: install with OAuth, and keep the token alive.

- Install: `/oauth/install` sends the operator to Linear's authorize page (actor=app, the agent
  scopes) with a `state` that only this service can mint: Fernet-encrypted under the service's keys,
  so any instance can verify it with no server-side session, and Fernet's own timestamp bounds it to
  10 minutes. `/oauth/callback` checks it, exchanges the code, asks Linear which workspace the token
  is for, and stores both tokens and the expiry, encrypted, in one transaction.
- Use: a token within 5 minutes of expiry is refreshed before it is used, and one Linear answers
  401 is refreshed once and the post retried. Refreshes of one org take a row lock
  (`credentials_lock`) and store the new pair in that same transaction: two instances never spend
  the same refresh token (Linear rotates it on use). An instance that waited on the lock finds the
  token already renewed and uses it.
- A refresh Linear refuses, or Linear's `OAuthApp` `revoked` webhook, marks the org disconnected:
  operators see it, and its posts wait in the outbox until a new install.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from shared.plumbing import crypto
from shared.plumbing.db import Pool, Tx, lend, require_tx, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query

if TYPE_CHECKING:
    import httpx

# httpx is imported where Linear is called, not at the top: importing it lengthens a function
# instance's cold start (with rich installed, its command-line module comes along), and most
# instances (claim, ack, a webhook that posts nothing) never call Linear.
log = logging.getLogger("devpilot.linear")

SCOPES = "read,write,app:assignable,app:mentionable"
STATE_SECONDS = 600
REFRESH_MARGIN = timedelta(minutes=5)
STATE_PREFIX = b"devpilot-oauth-state:"
# Which workspace the token is for, and the app user it acts as (the delegate the app sets).
ORGANIZATION = "query DevpilotOrganization { organization { id name urlKey } viewer { id } }"


PERSONAL_KEY_PREFIX = "lin_api_"  # Linear's personal API keys; its OAuth tokens are `lin_oauth_…`


def authorization(token: str) -> str:
    """The Authorization header Linear takes for this token: an OAuth access token as `Bearer`, a
    personal API key raw (Linear refuses a personal key sent as a Bearer token)."""
    return token if token.startswith(PERSONAL_KEY_PREFIX) else f"Bearer {token}"


def is_personal_key(token: str) -> bool:
    return token.startswith(PERSONAL_KEY_PREFIX)


class BadState(ValueError):
    """The `state` was not minted by this service, or is older than 10 minutes."""


class ExchangeRefused(RuntimeError):
    """Linear refused the code (or could not be asked): nothing is stored."""


@dataclass(frozen=True)
class Installed:
    org_id: str
    name: str


def redirect_uri(settings: Settings) -> str:
    return f"{(settings.public_url or '').rstrip('/')}/oauth/callback"


def install_url(settings: Settings) -> str:
    state = crypto.keys(settings).encrypt(STATE_PREFIX + secrets.token_bytes(16)).decode()
    params = {
        "client_id": settings.linear_client_id,
        "redirect_uri": redirect_uri(settings),
        "response_type": "code",
        "scope": SCOPES,
        "state": state,
        "actor": "app",
    }
    return f"{settings.linear_oauth_authorize_url}?{urlencode(params)}"


def check_state(settings: Settings, state: str) -> None:
    try:
        plain = crypto.keys(settings).decrypt(state.encode(), ttl=STATE_SECONDS)
    except (crypto.InvalidToken, UnicodeEncodeError):
        raise BadState("the state is not ours, or has expired") from None
    if not plain.startswith(STATE_PREFIX):
        raise BadState("the state is not an OAuth state")


def _token_request(http: httpx.Client, settings: Settings, form: dict[str, str]) -> dict[str, Any]:
    r = http.post(
        settings.linear_oauth_token_url,
        data={
            **form,
            "client_id": settings.linear_client_id or "",
            "client_secret": settings.linear_client_secret or "",
        },
    )
    if r.status_code != 200:
        raise ExchangeRefused(f"Linear's token endpoint answered HTTP {r.status_code}")
    body: dict[str, Any] = r.json()
    if not isinstance(body.get("access_token"), str):
        raise ExchangeRefused("Linear's token endpoint sent no access_token")
    return body


def finish_install(pool: Pool, settings: Settings, code: str, state: str) -> Installed:
    """The callback's work: state, code exchange, the workspace, one transaction to store."""
    import httpx

    check_state(settings, state)  # before anything is sent to Linear
    fernet = crypto.keys(settings)
    try:
        with httpx.Client(timeout=settings.linear_timeout_seconds) as http:
            tokens = _token_request(
                http,
                settings,
                {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri(settings)},
            )
            r = http.post(
                settings.linear_api_url,
                json={"query": ORGANIZATION},
                headers={"Authorization": f"Bearer {tokens['access_token']}"},
            )
            data = ((r.json() or {}).get("data") or {}) if r.status_code == 200 else {}
            org = data.get("organization")
            viewer = data.get("viewer") or {}
    except (httpx.HTTPError, ValueError) as exc:
        raise ExchangeRefused(f"Linear could not be asked: {type(exc).__name__}") from None
    if not isinstance(org, dict) or not isinstance(org.get("id"), str):
        raise ExchangeRefused("Linear did not say which workspace the token is for")
    with transaction(pool) as tx:
        tx.execute(
            query("credentials_store_oauth"),
            {
                "org_id": org["id"],
                "token": fernet.encrypt(tokens["access_token"].encode()),
                "refresh": fernet.encrypt(tokens["refresh_token"].encode())
                if tokens.get("refresh_token")
                else None,
                "expires_in": int(tokens.get("expires_in") or 86_400),
                "name": str(org.get("name") or org["id"]),
                "app_user_id": viewer.get("id") if isinstance(viewer.get("id"), str) else None,
            },
        )
    return Installed(org["id"], str(org.get("name") or org["id"]))


def store_static(pool: Pool, settings: Settings, org_id: str, access_token: str) -> None:
    token = crypto.keys(settings).encrypt(access_token.encode())
    with lend(pool) as conn:
        conn.execute(query("credentials_upsert"), {"org_id": org_id, "token": token})


def disconnect(tx: Tx, org_id: str, reason: str) -> bool:
    """In the caller's transaction (a refused refresh, Linear's `revoked` webhook)."""
    tx = require_tx(tx, "disconnect")
    return tx.one(query("credentials_disconnect"), {"org_id": org_id, "reason": reason}) is not None


def _expiring(row: Any) -> bool:
    expires: datetime | None = row["expires_at"]
    return row["kind"] == "oauth" and expires is not None and expires - REFRESH_MARGIN <= datetime.now(UTC)


class Tokens:
    """The access tokens one sending round uses, per org, refreshed when due (see the module doc)."""

    def __init__(self, pool: Pool, settings: Settings) -> None:
        self.pool, self.settings = pool, settings
        self.fernet = crypto.keys(settings)
        self._cache: dict[str, str | None] = {}
        self._cipher: dict[str, bytes] = {}  # the ciphertext each cached token came from

    def get(self, org_id: str) -> str | None:
        """A usable token, or None (no connection, or disconnected)."""
        if org_id not in self._cache:
            with lend(self.pool) as conn:
                row = conn.execute(query("credentials_get"), {"org_id": org_id}).fetchone()
            if row is None or row["disconnected_at"] is not None:
                self._cache[org_id] = None
            elif _expiring(row):
                self._cache[org_id] = self.refresh(org_id, stale=bytes(row["token_encrypted"]))
            else:
                self._cipher[org_id] = bytes(row["token_encrypted"])
                self._cache[org_id] = self.fernet.decrypt(self._cipher[org_id]).decode()
        return self._cache[org_id]

    def refused(self, org_id: str) -> str | None:
        """Linear answered 401 to the token: refresh once (unless another instance already did)."""
        return self.refresh(org_id, stale=self._cipher.get(org_id))

    def refresh(self, org_id: str, stale: bytes | None = None) -> str | None:
        """Renew under the org's row lock. `stale` is the ciphertext the caller found wanting: if the
        row holds another by the time the lock is ours, someone renewed it already: use that."""
        with transaction(self.pool) as tx:
            # The lock may wait for another instance's refresh, which waits for Linear: this
            # transaction's limits are Linear's timeout and a margin, not the hot path's.
            wait_ms = round(self.settings.linear_timeout_seconds * 1000) + 2000
            limits = {"statement_ms": wait_ms, "lock_ms": wait_ms}
            tx.execute(
                query("set_local_settings"),
                {**limits, "idle_ms": self.settings.idle_in_transaction_timeout_ms},
            )
            row = tx.one(query("credentials_lock"), {"org_id": org_id})
            if row is None or row["disconnected_at"] is not None:
                token = None
            elif (stale is not None and bytes(row["token_encrypted"]) != stale and not _expiring(row)) or row[
                "kind"
            ] != "oauth":
                self._cipher[org_id] = bytes(row["token_encrypted"])
                token = self.fernet.decrypt(self._cipher[org_id]).decode()
            elif row["refresh_token_encrypted"] is None:
                disconnect(tx, org_id, "the token expired and there is no refresh token")
                token = None
            else:
                token = self._renew(
                    tx, org_id, self.fernet.decrypt(bytes(row["refresh_token_encrypted"])).decode()
                )
        self._cache[org_id] = token
        return token

    def _renew(self, tx: Tx, org_id: str, refresh_token: str) -> str | None:
        import httpx

        try:
            with httpx.Client(timeout=self.settings.linear_timeout_seconds) as http:
                r = http.post(
                    self.settings.linear_oauth_token_url,
                    data={
                        "grant_type": "refresh_token",
                        "refresh_token": refresh_token,
                        "client_id": self.settings.linear_client_id or "",
                        "client_secret": self.settings.linear_client_secret or "",
                    },
                )
        except httpx.HTTPError as exc:  # Linear unreachable: nothing changes; the sweep tries again
            raise RefreshFailed(f"{type(exc).__name__}") from None
        if r.status_code in (400, 401):
            disconnect(tx, org_id, f"Linear refused the refresh (HTTP {r.status_code})")
            log.warning('{"event":"linear_disconnected","orgId":"%s"}', org_id)
            return None
        if r.status_code != 200 or not isinstance(r.json().get("access_token"), str):
            raise RefreshFailed(f"HTTP {r.status_code}")
        body = r.json()
        self._cipher[org_id] = self.fernet.encrypt(body["access_token"].encode())
        tx.execute(
            query("credentials_rotate"),
            {
                "org_id": org_id,
                "token": self._cipher[org_id],
                "refresh": self.fernet.encrypt(body["refresh_token"].encode())
                if body.get("refresh_token")
                else None,
                "expires_in": int(body.get("expires_in") or 86_400),
            },
        )
        return str(body["access_token"])


class RefreshFailed(RuntimeError):
    """Linear could not be asked (or answered 5xx): the token stays as it was; try later."""


def list_credentials(pool: Pool) -> list[dict[str, Any]]:
    """Each org's connection to Linear and its state (never a token)."""
    with lend(pool) as conn:
        return [dict(r) for r in conn.execute(query("credentials_list"))]


def delete_credentials(pool: Pool, org_id: str) -> bool:
    """The org's tokens forgotten; False: it had none."""
    with lend(pool) as conn:
        return conn.execute(query("credentials_delete"), {"org_id": org_id}).fetchone() is not None
