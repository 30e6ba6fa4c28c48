"""`realtime_token` (POST /realtime-token): a short-lived JWT for Supabase Realtime.

Realtime is only a wake-up: without Supabase configured this answers 404 realtime_disabled and
orchestrators keep polling /claim, which is fully correct on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime

import flask

from functions.web import ApiError, Call, reply
from shared.dispatch import realtime


def realtime_token(call: Call) -> flask.Response:
    settings = call.rt.settings
    if not settings.realtime_enabled:
        raise ApiError(404, "realtime_disabled", "Supabase Realtime is not configured; poll /claim")
    minted = realtime.mint(settings, call.orch.id, call.orch.org_id)
    return reply(
        {
            "token": minted.token,
            "expiresAt": datetime.fromtimestamp(minted.expires_at, UTC).isoformat(),
            "supabaseUrl": settings.supabase_url,
            "anonKey": settings.supabase_anon_key,
            "table": realtime.TABLE,
            "filter": minted.filter,
        }
    )
