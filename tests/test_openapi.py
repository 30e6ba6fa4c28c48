"""schemathesis against the real server: no 5xx, and every response matches infra/openapi.yaml."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.api import ADMIN, Api

schema = schemathesis.openapi.from_path(str(Path(__file__).parent.parent / "infra" / "openapi.yaml"))
ADMIN_OPS = {
    "listOrchestrators",
    "registerOrchestrator",
    "revokeOrchestrator",
    "sweep",
    "listLinearCredentials",
    "storeLinearCredentials",
    "metrics",
    "deleteLinearCredentials",
    "dashboard",
    "searchSessions",
    "sessionPage",
    "retrySession",
    "cancelSession",
    "moveSession",
}


# 40 examples per operation always; the heavy lane (DEVPILOT_HEAVY=1) tries 400.
EXAMPLES = 400 if os.environ.get("DEVPILOT_HEAVY") == "1" else 40


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_response_matches_the_schema(case: Any, api: Api) -> None:
    if not hasattr(api, "_st_token"):
        api._st_token = api.register()[1]  # type: ignore[attr-defined]
    op = case.operation.definition.raw.get("operationId")
    token = ADMIN if op in ADMIN_OPS else api._st_token  # type: ignore[attr-defined]
    headers = {"Authorization": f"Bearer {token}"}
    if isinstance(case.body, dict) and isinstance(case.body.get("waitSeconds"), int):
        case.body["waitSeconds"] = min(case.body["waitSeconds"], 1)  # long-polls are tested elsewhere
    case.call_and_validate(
        base_url=api.url,
        headers=headers,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
