"""People connect their own machines: `devpilot-orchestrator login`, as the service sees it.

1. The machine asks (`create`): its name and the S256 challenge of a PKCE verifier only it holds
   (RFC 7636); with the port it listens on at 127.0.0.1 (RFC 8252's loopback redirect), or for a
   short code to be typed on /enroll (a machine without a browser). Valid 10 minutes.
2. A browser signs in with Linear for it (`start_loopback`, `enter_code`): a sign-in flow bound to
   that browser by a `__Host-` cookie, whose `state` is random, stored hashed and good once.
3. Linear sends the browser back (`callback`): the flow is used up (only by the same browser), Linear
   says who signed in (shared.fleet.signin, which revokes the token at once), and the person must be an
   active, non-guest, non-app user of a workspace that has installed the app. Loopback: the browser
   is sent to `http://127.0.0.1:<port>/callback` with a one-time code, valid 60 s; the address is
   built from the port, never taken from the client. Code mode: a page names the machine, the
   workspace, and when and from where the request came, with Register and Deny (`decide`).
4. The machine redeems (`redeem`) with its verifier (and, loopback, the code): exactly once, for
   the machine's token. A wrong verifier or code spends the enrollment for good. The person's
   active machine of that name gets the new token (the old one stops at once; its work stays), or
   a new machine is registered.

The same sign-in, for `/me`, gives a person a session instead (shared.fleet.people).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from urllib.parse import urlencode
from uuid import UUID

from psycopg.rows import DictRow

from shared.fleet import orchestrators, people
from shared.fleet.signin import Viewer, authorize_url, identify, s256
from shared.plumbing.db import Pool, Tx, lend, transaction
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query

ENROLL_SECONDS = 600  # an enrollment, from the machine's request to its token
GRANT_SECONDS = 60  # the one-time code a loopback redirect hands the machine
FLOW_SECONDS = 600  # a /me sign-in's trip through Linear
POLL_SECONDS = 2  # how often a code-mode machine asks whether it was confirmed
FORGET_AFTER_SECONDS = 3600  # the sweep forgets enrollments this long past their expiry
ENROLL_LIMIT, ENROLL_WINDOW = 30, 600  # enrollments one client may ask for in the window
CODE_LIMIT, CODE_WINDOW = 5, 900  # wrong codes one client may type in the window, then 429
# RFC 8628's alphabet for codes people type: 20 consonants, no vowels (no words), no digits (no 0/O
# or 1/I to misread); case does not matter. 8 of them: about 34 bits.
CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
CODE_LENGTH = 8


def digest(secret: str) -> bytes:
    """How every code, state, cookie and token of a sign-in is stored and looked up."""
    return hashlib.sha256(secret.encode()).digest()


def new_user_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def show_code(code: str) -> str:
    """As people read it aloud and type it: two groups of four."""
    return f"{code[:4]}-{code[4:]}"


def normal_code(typed: str) -> str | None:
    """What a person typed, as the code it means (any case, dashes and spaces left out), or None."""
    code = "".join(ch for ch in typed.upper() if ch not in " -\t")
    return code if len(code) == CODE_LENGTH and all(ch in CODE_ALPHABET for ch in code) else None


class Limited(Exception):
    """Too many requests of this kind from this client: 429 for a while."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("too many attempts; try again later")
        self.retry_after = retry_after


class Gone(Exception):
    """The enrollment or sign-in is unknown, used, expired or refused: start again."""


class WrongCode(Exception):
    """The typed code names no live enrollment (counted against the client)."""


class BadState(Exception):
    """The callback's `state` is not a live flow of this browser: forged, used, expired, or
    `other_browser` — a live flow started by another browser."""

    def __init__(self, other_browser: bool) -> None:
        super().__init__("another browser" if other_browser else "unknown state")
        self.other_browser = other_browser


class NotAllowed(Exception):
    """Linear said who signed in, and they may not: `code` is the contract's error code. For a
    loopback login, `loopback` is where the browser goes on to tell the waiting machine (its
    enrollment is refused for good: `refuse`)."""

    def __init__(self, code: Literal["not_allowed", "workspace_not_connected"], detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail
        self.loopback: str | None = None


class TokenError(Exception):
    """`/enroll/token`'s refusals (the contract's codes)."""

    def __init__(
        self,
        code: Literal["authorization_pending", "invalid_grant", "expired_token", "access_denied"],
        detail: str,
    ) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def _limit(pool: Pool, key: str, limit: int, window: int, *, count: bool) -> None:
    """Refuse once `key` has had `limit` hits in the window; with `count`, this call is one of them."""
    with lend(pool) as conn:
        if count:
            row = conn.execute(query("rate_hit"), {"key": key, "window": window}).fetchone()
            hits = int(row["hits"]) - 1 if row else 0
        else:
            row = conn.execute(query("rate_hits"), {"key": key, "window": window}).fetchone()
            hits = int(row["hits"]) if row else 0
    if hits >= limit:
        raise Limited(window)


@dataclass(frozen=True)
class Created:
    id: UUID
    user_code: str | None  # code mode: shown to the person, stored only hashed


def create(pool: Pool, *, name: str, challenge: str, port: int | None, client: str) -> Created:
    """A machine asks to be enrolled (loopback when it gives a port, else code mode)."""
    _limit(pool, f"enroll:{client}", ENROLL_LIMIT, ENROLL_WINDOW, count=True)
    for _ in range(5):  # (a code already live: draw another)
        code = new_user_code() if port is None else None
        with lend(pool) as conn:
            row = conn.execute(
                query("enrollment_create"),
                {
                    "mode": "loopback" if port is not None else "code",
                    "name": name,
                    "code_challenge": challenge,
                    "loopback_port": port,
                    "user_code_hash": digest(code) if code else None,
                    "requested_from": client,
                    "seconds": ENROLL_SECONDS,
                },
            ).fetchone()
        if row is not None:
            return Created(row["id"], code)
    raise RuntimeError("could not draw a free enrollment code")


@dataclass(frozen=True)
class Started:
    """A browser's sign-in: where to send it (Linear), and the secret of its `__Host-` cookie."""

    location: str
    browser_secret: str


def _flow(settings: Settings) -> tuple[str, str, dict[str, bytes]]:
    state, browser = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    return state, browser, {"state_hash": digest(state), "browser_hash": digest(browser)}


def start_loopback(pool: Pool, settings: Settings, enrollment_id: UUID) -> Started:
    state, browser, params = _flow(settings)
    with lend(pool) as conn:
        row = conn.execute(
            query("flow_start_enrollment"), {**params, "enrollment_id": enrollment_id}
        ).fetchone()
    if row is None:
        raise Gone("this sign-in link is unknown, already used, or older than 10 minutes")
    return Started(authorize_url(settings, state, browser), browser)


def enter_code(pool: Pool, settings: Settings, typed: str, client: str) -> Started:
    """A code typed on /enroll. Wrong ones are counted per client: at CODE_LIMIT, Limited (even for
    a right code, and a right one never resets the count: anyone can make a code of their own)."""
    key = f"code:{client}"
    _limit(pool, key, CODE_LIMIT, CODE_WINDOW, count=False)
    code = normal_code(typed)
    state, browser, params = _flow(settings)
    row = None
    if code is not None:
        with lend(pool) as conn:
            row = conn.execute(query("flow_start_code"), {**params, "code_hash": digest(code)}).fetchone()
    if row is None:
        _limit(pool, key, CODE_LIMIT, CODE_WINDOW, count=True)
        raise WrongCode("that code is not one we know, or it has expired")
    return Started(authorize_url(settings, state, browser), browser)


def start_me(pool: Pool, settings: Settings) -> Started:
    state, browser, params = _flow(settings)
    with lend(pool) as conn:
        conn.execute(query("flow_start_me"), {**params, "seconds": FLOW_SECONDS})
    return Started(authorize_url(settings, state, browser), browser)


@dataclass(frozen=True)
class Confirm:
    """Code mode: what the confirm page shows, and its CSRF token."""

    enrollment_id: UUID
    machine: str
    requested_from: str
    requested_at: datetime
    csrf: str


@dataclass(frozen=True)
class SignedIn:
    """The callback's outcome: the loopback address to send the browser to, the confirm page, or
    (for /me) the new session's cookie value; and who signed in."""

    viewer: Viewer
    loopback: str | None = None
    confirm: Confirm | None = None
    session: str | None = None


def callback(pool: Pool, settings: Settings, code: str, state: str, browser_secret: str) -> SignedIn:
    with lend(pool) as conn:
        flow = conn.execute(
            query("flow_take"), {"state_hash": digest(state), "browser_hash": digest(browser_secret)}
        ).fetchone()
        if flow is None:
            other = conn.execute(query("flow_known"), {"state_hash": digest(state)}).fetchone()
            raise BadState(other_browser=other is not None)
    viewer = identify(settings, code, browser_secret)  # SignInFailed: Linear refused or is away
    try:
        _allowed(pool, viewer, settings)
    except NotAllowed as exc:
        if flow["purpose"] == "enroll":  # the machine waiting hears it, and stops waiting
            exc.loopback = refuse(pool, flow["enrollment_id"], exc.detail)
        raise
    person = {"org_id": viewer.org_id, "linear_user_id": viewer.id}
    with transaction(pool) as tx:
        people.seen(tx, viewer.org_id, viewer.id, viewer.name, viewer.workspace)
        if flow["purpose"] == "me":
            return SignedIn(viewer, session=people.start_session(tx, viewer.org_id, viewer.id))
        grant, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        row = tx.one(
            query("enrollment_signed_in"),
            {
                **person,
                "id": flow["enrollment_id"],
                "browser_hash": digest(browser_secret),
                "grant_hash": digest(grant),
                "grant_seconds": GRANT_SECONDS,
                "confirm_hash": digest(csrf),
            },
        )
    if row is None:
        raise Gone("this sign-in has ended (already used, or older than 10 minutes)")
    if row["mode"] == "loopback":
        return SignedIn(
            viewer, loopback=_loopback(row["loopback_port"], code=grant, state=flow["enrollment_id"])
        )
    confirm = Confirm(
        flow["enrollment_id"], row["name"], row["requested_from"] or "", row["created_at"], csrf
    )
    return SignedIn(viewer, confirm=confirm)


def _loopback(port: int, **params: object) -> str:
    """The machine's loopback redirect (RFC 8252): the address built from the port it gave, never
    taken from the client; `state` is the enrollment's id."""
    return f"http://127.0.0.1:{int(port)}/callback?{urlencode({k: str(v) for k, v in params.items()})}"


def refuse(pool: Pool, enrollment_id: UUID, reason: str) -> str | None:
    """The sign-in for this enrollment was refused (by us or by Linear): the enrollment ends, and
    `POST /enroll/token` answers `access_denied` with `reason`. Where the browser goes on to tell a
    loopback login at once (RFC 6749 §4.1.2.1: the error, sent to the redirect URI, with the
    state); None for code mode (its machine hears it at its next poll) or an enrollment already over."""
    with lend(pool) as conn:
        row = conn.execute(query("enrollment_refuse"), {"id": enrollment_id, "refusal": reason}).fetchone()
    if row is None or row["mode"] != "loopback":
        return None
    return _loopback(
        row["loopback_port"], error="access_denied", error_description=reason, state=enrollment_id
    )


def refused_by_linear(pool: Pool, state: str, browser_secret: str, said: str) -> str | None:
    """Linear sent the browser back with an `error` (the person cancelled, say): the sign-in flow
    of this state and browser is used up, and an enrollment's is refused (`refuse`): where the
    browser goes on, or None (a /me sign-in, code mode, or no live flow of this browser)."""
    with lend(pool) as conn:
        flow = conn.execute(
            query("flow_take"), {"state_hash": digest(state), "browser_hash": digest(browser_secret)}
        ).fetchone()
    if flow is None or flow["purpose"] != "enroll":
        return None
    return refuse(pool, flow["enrollment_id"], f"Linear did not sign you in: {said}")


def _allowed(pool: Pool, viewer: Viewer, settings: Settings) -> None:
    if viewer.app:
        raise NotAllowed("not_allowed", "an app user cannot connect a machine; sign in as yourself")
    if viewer.guest:
        raise NotAllowed("not_allowed", f"guests of {viewer.workspace} cannot connect machines")
    if not viewer.active:
        raise NotAllowed("not_allowed", f"your account in {viewer.workspace} is deactivated")
    with lend(pool) as conn:
        connected = conn.execute(query("org_connected"), {"org_id": viewer.org_id}).fetchone()
    if connected is None:
        base = (settings.public_url or "").rstrip("/")
        raise NotAllowed(
            "workspace_not_connected",
            f"the Linear workspace {viewer.workspace} has not installed devpilot: "
            f"ask your admin to install it at {base}/oauth/install",
        )


def decide(pool: Pool, enrollment_id: UUID, browser_secret: str, csrf: str, *, approve: bool) -> str:
    """Code mode's Register or Deny: the machine's name, or Gone."""
    with lend(pool) as conn:
        row = conn.execute(
            query("enrollment_decide"),
            {
                "id": enrollment_id,
                "browser_hash": digest(browser_secret),
                "confirm_hash": digest(csrf),
                "approve": approve,
            },
        ).fetchone()
    if row is None:
        raise Gone("this request has already been answered, has expired, or was opened in another browser")
    return str(row["name"])


@dataclass(frozen=True)
class Redeemed:
    orchestrator_id: UUID
    token: str
    org_id: str
    linear_user_id: str
    name: str
    replaced: bool


def redeem(pool: Pool, enrollment_id: UUID, verifier: str, code: str | None) -> Redeemed:
    """The machine's token, once. Judged under the enrollment's row lock; a refusal that spends the
    enrollment commits the spending before it is raised."""
    refusal: TokenError | None = None
    with transaction(pool) as tx:
        row = tx.one(query("enrollment_lock"), {"id": enrollment_id})
        if row is None or row["status"] in ("redeemed", "spent"):
            raise TokenError("invalid_grant", "this enrollment is unknown or already used")
        if row["expired"]:
            raise TokenError("expired_token", "this enrollment is older than 10 minutes; log in again")
        if not hmac.compare_digest(s256(verifier).encode(), str(row["code_challenge"]).encode()):
            refusal = TokenError("invalid_grant", "wrong code verifier: this enrollment is spent")
        elif row["status"] == "denied":  # Deny on the confirm page, or a refused sign-in (why)
            raise TokenError("access_denied", row["refusal"] or "the request was denied on the confirm page")
        elif row["mode"] == "loopback":
            if code is None:
                raise TokenError("authorization_pending", "nobody has signed in yet")
            granted = row["status"] == "signed_in" and row["grant_live"]
            if not (granted and hmac.compare_digest(digest(code), bytes(row["grant_hash"] or b""))):
                refusal = TokenError("invalid_grant", "wrong, used or late code: this enrollment is spent")
        elif row["status"] != "approved":
            raise TokenError("authorization_pending", "nobody has signed in and confirmed yet")
        if refusal is not None:
            tx.execute(query("enrollment_spend"), {"id": enrollment_id})
        else:
            redeemed = _register(tx, row)
    if refusal is not None:
        raise refusal
    return redeemed


def _register(tx: Tx, row: DictRow) -> Redeemed:
    machine = orchestrators.enroll(tx, str(row["org_id"]), str(row["linear_user_id"]), str(row["name"]))
    tx.execute(query("enrollment_redeemed"), {"id": row["id"], "orchestrator_id": machine.id})
    return Redeemed(
        machine.id,
        machine.token,
        str(row["org_id"]),
        str(row["linear_user_id"]),
        str(row["name"]),
        machine.replaced,
    )


@dataclass(frozen=True)
class Forgotten:
    enrollments: int
    flows: int
    sessions: int


def forget_stale(pool: Pool) -> Forgotten:
    """The sweep's part: enrollments and sign-in flows long past their expiry, ended /me sessions."""
    with lend(pool) as conn:
        row = conn.execute(query("signin_forget"), {"after": FORGET_AFTER_SECONDS}).fetchone()
    assert row is not None
    return Forgotten(int(row["enrollments"]), int(row["flows"]), int(row["sessions"]))
