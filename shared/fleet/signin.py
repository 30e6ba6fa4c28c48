"""Signing a person in with Linear (actor=user, scope read), and asking Linear about a workspace's users.

The service only learns who signed in: it exchanges Linear's code, asks `viewer`, and revokes the
token at once (LINEAR_OAUTH_REVOKE_URL), whatever the answers were. It keeps no credential of the
person, and never touches the workspace's stored app credentials (a sign-in is not an install, and
must never look like the app being uninstalled).

PKCE (RFC 7636, S256) guards the exchange between the service and Linear too: its verifier is
derived from the browser's sign-in cookie (an HMAC under the cookie's random value), so it is
stored nowhere, never travels in a URL, and only the browser that started the sign-in can bring
the code back to something that redeems it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from shared.linear import auth as linear_auth
from shared.plumbing import crypto
from shared.plumbing.db import Pool
from shared.plumbing.settings import Settings

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("devpilot.signin")

SCOPE = "read"
VIEWER = "query DevpilotViewer { viewer { id name active guest app organization { id name urlKey } } }"
MEMBER = """query DevpilotMember($id: ID!) {
  users(filter: {id: {eq: $id}}, includeDisabled: true, first: 1) { nodes { id } }
}"""


class SignInFailed(RuntimeError):
    """Linear refused the code, or could not be asked: nobody is signed in."""


@dataclass(frozen=True)
class Viewer:
    """Who signed in, as Linear's `viewer` says."""

    id: str
    name: str
    active: bool
    guest: bool
    app: bool
    org_id: str
    workspace: str


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def s256(verifier: str) -> str:
    """RFC 7636's S256 code challenge of a verifier: BASE64URL(SHA256(ASCII(verifier)))."""
    return b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def verifier_for(browser_secret: str) -> str:
    """The service's PKCE verifier towards Linear for one browser's sign-in (43 characters)."""
    return b64url(hmac.new(browser_secret.encode(), b"devpilot linear pkce", hashlib.sha256).digest())


def redirect_uri(settings: Settings) -> str:
    return f"{(settings.public_url or '').rstrip('/')}/enroll/callback"


def _client(settings: Settings) -> tuple[str, str]:
    client = settings.signin_client
    if client is None:
        raise SignInFailed("no OAuth client to sign people in with")
    return client


def authorize_url(settings: Settings, state: str, browser_secret: str) -> str:
    """Linear's authorize page for a person (actor=user, scope read), PKCE S256, our state.
    `prompt=consent` lets someone in several workspaces pick the one this is for."""
    params = {
        "client_id": _client(settings)[0],
        "redirect_uri": redirect_uri(settings),
        "response_type": "code",
        "scope": SCOPE,
        "state": state,
        "actor": "user",
        "code_challenge": s256(verifier_for(browser_secret)),
        "code_challenge_method": "S256",
        "prompt": "consent",
    }
    return f"{settings.linear_oauth_authorize_url}?{urlencode(params)}"


def authorization(token: str) -> str:
    """The Authorization header Linear expects for a token: a personal API key raw, else Bearer."""
    return token if token.startswith("lin_api_") else f"Bearer {token}"


def identify(settings: Settings, code: str, browser_secret: str) -> Viewer:
    """Exchange Linear's code (with this browser's verifier), ask who signed in, revoke the token."""
    import httpx

    client_id, client_secret = _client(settings)
    with httpx.Client(timeout=settings.linear_timeout_seconds) as http:
        try:
            r = http.post(
                settings.linear_oauth_token_url,
                data={
                    "grant_type": "authorization_code",
                    "code": code,
                    "redirect_uri": redirect_uri(settings),
                    "client_id": client_id,
                    "client_secret": client_secret,
                    "code_verifier": verifier_for(browser_secret),
                },
            )
            tokens = r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError) as exc:
            raise SignInFailed(f"Linear could not be asked: {type(exc).__name__}") from None
        access = tokens.get("access_token") if isinstance(tokens, dict) else None
        if not isinstance(access, str):
            raise SignInFailed(f"Linear did not accept the sign-in (HTTP {r.status_code})")
        try:
            return _viewer(http, settings, access)
        finally:
            _revoke(http, settings, access, tokens.get("refresh_token"))


def _viewer(http: httpx.Client, settings: Settings, access: str) -> Viewer:
    import httpx

    try:
        r = http.post(
            settings.linear_api_url, json={"query": VIEWER}, headers={"Authorization": f"Bearer {access}"}
        )
        viewer = ((r.json() or {}).get("data") or {}).get("viewer") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise SignInFailed(f"Linear could not be asked who signed in: {type(exc).__name__}") from None
    org = viewer.get("organization") if isinstance(viewer, dict) else None
    if not isinstance(viewer, dict) or not isinstance(org, dict) or not isinstance(viewer.get("id"), str):
        raise SignInFailed("Linear did not say who signed in")
    return Viewer(
        id=viewer["id"],
        name=str(viewer.get("name") or viewer["id"]),
        active=viewer.get("active") is True,
        guest=viewer.get("guest") is not False,  # (unsaid: treated as the narrower, a guest)
        app=viewer.get("app") is not False,
        org_id=str(org.get("id") or ""),
        workspace=str(org.get("name") or org.get("id") or ""),
    )


def _revoke(http: httpx.Client, settings: Settings, access: str, refresh: Any) -> None:
    """Revoke the person's token (and its refresh token, if Linear gave one). Best effort: a failure
    is logged, never shown (the access token then lapses on its own within a day)."""
    import httpx

    tried: list[tuple[dict[str, str], dict[str, str] | None]] = [
        ({"Authorization": f"Bearer {access}"}, None)
    ]
    if isinstance(refresh, str) and refresh:
        tried.append(({}, {"refresh_token": refresh}))
    for headers, form in tried:
        try:
            r = http.post(settings.linear_oauth_revoke_url, headers=headers, data=form)
            if r.status_code != 200:
                log.warning('{"event":"signin_revoke_refused","status":%d}', r.status_code)
        except httpx.HTTPError as exc:
            log.warning('{"event":"signin_revoke_failed","error":"%s"}', type(exc).__name__)


def is_member(pool: Pool, settings: Settings, org_id: str, linear_user_id: str) -> bool | None:
    """Whether Linear knows this user in the workspace (one read with the workspace's own token):
    True or False, or None when Linear cannot be asked (no connection, or no usable answer)."""
    import httpx

    try:
        tokens = linear_auth.Tokens(pool, settings)
        token = tokens.get(org_id)
        if token is None:
            return None
        body = {"query": MEMBER, "variables": {"id": linear_user_id}}
        with httpx.Client(timeout=settings.linear_timeout_seconds) as http:
            r = http.post(settings.linear_api_url, json=body, headers={"Authorization": authorization(token)})
            # Any other answer (a 401 included: the posts' own retry refreshes the token, not a
            # typo guard) means Linear could not be asked.
            if r.status_code != 200:
                return None
            nodes = (((r.json() or {}).get("data") or {}).get("users") or {}).get("nodes")
    except (
        crypto.NotConfigured,
        crypto.InvalidToken,
        linear_auth.RefreshFailed,
        httpx.HTTPError,
        ValueError,
    ):
        return None
    if not isinstance(nodes, list):
        return None
    return any(isinstance(n, dict) and n.get("id") == linear_user_id for n in nodes)
