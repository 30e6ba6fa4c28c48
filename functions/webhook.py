"""`webhook` (POST /webhook): Linear webhook intake.

Verifies the signature over the raw body before reading it and rejects stale timestamps; the
service then records the delivery id with whatever the event causes in one transaction, so
Linear's retries (same delivery) are answered `duplicate` and two concurrent copies dispatch once.
"""

from __future__ import annotations

import time

import flask

from functions.web import ApiError, Call, note, raw_body, reply
from shared.dispatch import Refused, linear


def webhook(call: Call) -> flask.Response:
    secrets = call.rt.settings.webhook_secrets
    if not secrets:
        raise ApiError(503, "not_configured", "LINEAR_WEBHOOK_SECRET is not set on this server")
    body = raw_body(call.request)
    signature = call.request.headers.get("Linear-Signature")
    if not signature:  # (what a hand-made request forgets; Linear signs every delivery)
        raise ApiError(
            401,
            "bad_signature",
            "the Linear-Signature header is missing: Linear signs each webhook with its secret "
            "(HMAC-SHA256 of the body, hex); set LINEAR_WEBHOOK_SECRET to that secret",
        )
    if not linear.signed_by_any(secrets, body, signature):
        raise ApiError(401, "bad_signature", "Linear-Signature does not match the body")
    try:
        hook = linear.parse(body)
    except linear.BadWebhook as exc:
        raise ApiError(400, "bad_request", str(exc)) from None
    if not linear.is_fresh(hook, int(time.time() * 1000), call.rt.settings.webhook_tolerance_seconds):
        raise ApiError(401, "stale_webhook", "webhookTimestamp is too far from now")
    try:
        answer = call.service.receive_webhook(hook, call.request.headers.get("Linear-Delivery"))
    except Refused as exc:  # nothing written; Linear delivers again
        raise ApiError(503, exc.code, exc.detail, {"Retry-After": "60"}) from None
    note(
        sessionId=answer.get("sessionId"),
        queueId=answer.get("queueId"),
        messageId=answer.get("messageId"),
        orchestratorId=answer.get("orchestratorId"),
        outcome=answer["status"],
    )
    return reply(answer)
