"""`webhook` target: Linear webhook intake (POST /webhook).

Verifies the signature over the raw body before reading it, rejects stale timestamps, then one
transaction records the delivery id with whatever the event causes, so Linear's retries (same
delivery) are answered `duplicate` and two concurrent copies dispatch once.
"""

from __future__ import annotations

import time

import flask
import functions_framework

from functions.runtime import Runtime
from functions.web import ApiError, handler, note, raw_body, reply, require_method
from shared import intake, linear


@functions_framework.http
@handler("webhook")
def webhook(request: flask.Request, rt: Runtime) -> flask.Response:
    require_method(request, "POST")
    secret = rt.settings.linear_webhook_secret
    if not secret:
        raise ApiError(503, "not_configured", "LINEAR_WEBHOOK_SECRET is not set on this server")
    body = raw_body(request)
    if not linear.signature_ok(secret, body, request.headers.get("Linear-Signature")):
        raise ApiError(401, "bad_signature", "Linear-Signature does not match the body")
    try:
        hook = linear.parse(body)
    except linear.BadWebhook as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    if not linear.is_fresh(hook, int(time.time() * 1000), rt.settings.webhook_tolerance_seconds):
        raise ApiError(401, "stale_webhook", "webhookTimestamp is too far from now")
    answer, notice_ids = intake.receive_noting(
        rt.pool, hook, hook.delivery_key(request.headers.get("Linear-Delivery"))
    )
    rt.send_soon(notice_ids)
    note(
        sessionId=answer.get("sessionId"),
        queueId=answer.get("queueId"),
        messageId=answer.get("messageId"),
        orchestratorId=answer.get("orchestratorId"),
        outcome=answer["status"],
    )
    return reply(answer)
