"""Credentials an agent COMMAND uses to speak in its own agent session, and nothing else.

The machine's token never reaches COMMAND. Instead the orchestrator gives COMMAND
`dpa.<orchestratorId>.<agentSessionId, base64url>.<expiry>.<mac>`, where mac is HMAC-SHA256 over
the rest, keyed with SHA-256(the machine's token). The service stores exactly that hash for every
machine (never the token), so it can check the mac without holding a new secret; COMMAND cannot
get the machine's token or its hash back from it, nor make one for another agent session. It stops
working when its machine is revoked, or when it expires.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import NamedTuple
from uuid import UUID

PREFIX = "dpa"
LIFETIME_SECONDS = 7 * 24 * 3600


def token_hash(machine_token: str) -> bytes:
    return hashlib.sha256(machine_token.encode("utf-8")).digest()


def _mac(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode("utf-8"), hashlib.sha256).hexdigest()


def mint(machine_token: str, orchestrator_id: str, agent_session_id: str, now: float | None = None) -> str:
    expires = int(now if now is not None else time.time()) + LIFETIME_SECONDS
    session = base64.urlsafe_b64encode(agent_session_id.encode("utf-8")).decode().rstrip("=")
    payload = f"{PREFIX}.{orchestrator_id}.{session}.{expires}"
    return f"{payload}.{_mac(token_hash(machine_token), payload)}"


class Claimed(NamedTuple):
    """What an agent token says of itself, before its mac is checked against the machine's hash."""

    orchestrator_id: UUID
    agent_session_id: str
    expires: int
    payload: str
    mac: str

    def valid(self, machine_token_hash: bytes, now: float | None = None) -> bool:
        fresh = self.expires >= (now if now is not None else time.time())
        return fresh and hmac.compare_digest(
            _mac(machine_token_hash, self.payload).encode(), self.mac.encode()
        )


def parse(token: str) -> Claimed | None:
    parts = token.split(".")
    if len(parts) != 5 or parts[0] != PREFIX:
        return None
    try:
        orchestrator_id = UUID(parts[1])
        session = base64.urlsafe_b64decode(parts[2] + "=" * (-len(parts[2]) % 4)).decode("utf-8")
        expires = int(parts[3])
    except (ValueError, UnicodeDecodeError):
        return None
    return Claimed(orchestrator_id, session, expires, ".".join(parts[:4]), parts[4])
