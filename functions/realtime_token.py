"""`realtime_token` target (POST /realtime-token): a short-lived JWT for Supabase Realtime.

Realtime is only a wake-up: without Supabase configured this answers 404 realtime_disabled and
orchestrators keep polling /claim, which is fully correct on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime

import flask
import functions_framework

from functions.runtime import Runtime
from functions.web import ApiError, handler, reply, require_method, require_orchestrator
from shared import realtime


@functions_framework.http
@handler("realtime_token")
def realtime_token(request: flask.Request, rt: Runtime) -> flask.Response:
    require_method(request, "POST")
    orch = require_orchestrator(request, rt)
    if not rt.settings.realtime_enabled:
        raise ApiError(404, "realtime_disabled", "Supabase Realtime is not configured; poll /claim")
    minted = realtime.mint(rt.settings, orch.id, orch.org_id)
    return reply(
        {
            "token": minted.token,
            "expiresAt": datetime.fromtimestamp(minted.expires_at, UTC).isoformat(),
            "supabaseUrl": rt.settings.supabase_url,
            "anonKey": rt.settings.supabase_anon_key,
            "table": realtime.TABLE,
            "filter": minted.filter,
        }
    )
