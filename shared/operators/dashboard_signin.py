"""The operators' dashboard sign-in: its sessions (a new random one per login, only its hash
stored, at most `SESSION_SECONDS`; a logout ends it on the server) and the limit on wrong tokens
from one client. The owner of `dashboard_sessions` and `dashboard_login_failures`
(queries/dashboard.sql); the admin token itself is compared by the handler."""

from __future__ import annotations

import hashlib
import secrets

from shared.plumbing.db import Pool, lend
from shared.plumbing.sql import query

SESSION_SECONDS = 12 * 3600
LOGIN_LIMIT, LOGIN_WINDOW_SECONDS = 5, 15 * 60  # wrong tokens from one client, then 429 for the window


def _hash(session: str) -> bytes:
    return hashlib.sha256(session.encode()).digest()


def _client(client: str) -> dict[str, object]:
    return {"client": client, "limit": LOGIN_LIMIT, "window": LOGIN_WINDOW_SECONDS}


def session_valid(pool: Pool, session: str) -> bool:
    """A dashboard session that was started by a login and has not ended or expired."""
    with lend(pool) as conn:
        row = conn.execute(query("dashboard_session_valid"), {"token_hash": _hash(session)}).fetchone()
    return row is not None


def login_blocked(pool: Pool, client: str) -> bool:
    """Too many wrong tokens from this client within the window."""
    with lend(pool) as conn:
        return conn.execute(query("dashboard_login_blocked"), _client(client)).fetchone() is not None


def login_failed(pool: Pool, client: str) -> None:
    """One more wrong token from this client."""
    with lend(pool) as conn:
        conn.execute(query("dashboard_login_failed"), _client(client))


def start_session(pool: Pool, client: str) -> str:
    """A right token: a new session (its secret, for the cookie), and the client's count of wrong
    tokens cleared."""
    session = secrets.token_urlsafe(32)
    with lend(pool) as conn:
        conn.execute(
            query("dashboard_session_create"), {"token_hash": _hash(session), "seconds": SESSION_SECONDS}
        )
        conn.execute(query("dashboard_login_ok"), _client(client))
    return session


def end_session(pool: Pool, session: str) -> None:
    """Logout: the session ends on the server, and its cookie opens nothing afterwards."""
    with lend(pool) as conn:
        conn.execute(query("dashboard_session_end"), {"token_hash": _hash(session)})
