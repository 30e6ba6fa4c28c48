"""Short-lived Supabase Realtime tokens that let row-level security show an orchestrator only its
own `dispatch_queue` rows (policy in infra/supabase/). HS256 with the project's JWT secret, or ES256
with an imported private key and its key id, as Supabase's asymmetric signing keys require."""

from __future__ import annotations

import time
from dataclasses import dataclass
from uuid import UUID

import jwt

from shared.plumbing.settings import Settings

TABLE = "dispatch_queue"


@dataclass(frozen=True)
class RealtimeToken:
    token: str
    expires_at: int
    filter: str


def mint(settings: Settings, orchestrator_id: UUID, org_id: str, now: int | None = None) -> RealtimeToken:
    issued = int(now if now is not None else time.time())
    expires = issued + settings.realtime_token_seconds
    claims = {
        "sub": str(orchestrator_id),
        "role": "authenticated",
        "aud": "authenticated",
        "iat": issued,
        "exp": expires,
        "orchestrator_id": str(orchestrator_id),
        "org_id": org_id,
    }
    if settings.supabase_jwt_private_key:
        headers = {"kid": settings.supabase_jwt_kid} if settings.supabase_jwt_kid else None
        token = jwt.encode(claims, settings.supabase_jwt_private_key, algorithm="ES256", headers=headers)
    else:
        assert settings.supabase_jwt_secret
        token = jwt.encode(claims, settings.supabase_jwt_secret, algorithm="HS256")
    return RealtimeToken(token, expires, f"orchestrator_id=eq.{orchestrator_id}")
