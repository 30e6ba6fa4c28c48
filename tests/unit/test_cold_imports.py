"""Cold start (#17): a target imports what it needs, not every target's dependencies. The routes an
idle fleet calls all day (claim, ack) never load the HTTP client, the crypto library, the metrics
library or the Linear-facing modules; measured in bench/ (cold start), guarded here (and, serving a
real request, in tests/test_cloud_shape.py and below: each target's first request, served)."""

from __future__ import annotations

import json
import os
from typing import Any
from uuid import uuid4

import pytest

from shared.linear.webhooks import sign
from tests.helpers.api import SECRET, agent_session_event, app_revoked_event, issue_event
from tests.helpers.data import MakeOrch
from tests.helpers.fresh_python import ROOT, run_json

HEAVY = [
    "httpx",
    "cryptography",
    "rich",
    "prometheus_client",
    "shared.linear.webhooks",
    "shared.delivery.intake",
    "shared.linear.notices",
    "shared.linear.auth",
]


def loaded_by(target: str) -> set[str]:
    # The target, and its route's module as its first request imports it.
    code = (
        "import sys, json, importlib, functions.main as m; from functions.routes import BY_NAME; "
        f"getattr(m, {target!r}); importlib.import_module(BY_NAME[{target!r}].module); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    return set(run_json(code))


@pytest.mark.parametrize("target", ["claim", "ack", "release", "healthz"])
def test_fleet_targets_do_not_load_what_only_linear_routes_need(target: str) -> None:
    assert not loaded_by(target) & set(HEAVY)


# What the intake imports where it is used (shared/delivery/intake.py, ROUTING_ON_USE): the routing
# chain, Linear's notices and auth. An issue's plain assignment needs none of them.
ROUTING_ON_USE = {
    "shared.delivery.routing",
    "shared.delivery.repository_choice",
    "shared.linear.api",
    "shared.linear.notices",
    "shared.linear.auth",
    "shared.fleet.machines",
}


def test_the_webhook_target_loads_its_intake_when_it_first_answers() -> None:
    # (the check above would pass vacuously if nothing could ever load them; httpx itself waits
    # until a notice is sent: tests/test_cloud_shape.py; the routing chain until a webhook needs
    # it: the first requests below)
    code = (
        "import sys, json, functions.webhook, shared.dispatch, shared.delivery.intake; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    loaded = set(run_json(code))
    assert {"shared.linear.webhooks", "shared.delivery.intake"} <= loaded
    assert not loaded & ROUTING_ON_USE, sorted(loaded & ROUTING_ON_USE)
    assert "httpx" not in loaded


# The first request of a fresh process, as functions-framework serves it (a cold instance): its
# status, the modules the process then holds, and, where it loaded pydantic, whether pydantic read
# the installed distributions' entry points for plugins (its private cache, `_plugins`, is None
# until it has).
FIRST_REQUEST = """
import gc, json, sys, functions_framework
target, method, body, headers = sys.argv[1], sys.argv[2], sys.argv[3].encode(), json.loads(sys.argv[4])
app = functions_framework.create_app(target, "functions/main.py")
r = app.test_client().open("/", method=method, data=body, headers=headers)
modules = sorted(sys.modules)
plugins_read = None
if "pydantic" in sys.modules:
    from pydantic.plugin import _loader
    plugins_read = _loader._plugins is not None
print(json.dumps({
    "status": r.status_code,
    "body": r.get_data(as_text=True)[:300],
    "modules": modules,
    "plugins_read": plugins_read,
    "frozen": gc.get_freeze_count(),
    "collecting": gc.isenabled(),
    "collectable": len(gc.get_objects()),
}))
"""

# What no first request of these targets needs (bench/README.md, Cold start): pydantic (50-90 ms of
# import: the settings, the wire messages and the fleet's bodies are plain classes), the other
# routes' bodies, the dashboard's pages, Realtime's tokens, people's sign-in, the HTTP client, the
# crypto and metrics libraries.
NOT_ON_FIRST_REQUEST = {
    "pydantic",
    "pydantic_core",
    "functions.bodies",
    "functions.dashboard",
    "functions.pages",
    "shared.delivery.realtime",
    "shared.fleet.signin",
    "httpx",
    "cryptography",
    "prometheus_client",
}
# ...nor, on the fleet's targets, the webhook's intake and the machines' repositories it routes by.
FLEET_NEVER = {
    "shared.linear.webhooks",
    "shared.delivery.intake",
    "shared.linear.notices",
    "shared.linear.auth",
    "shared.fleet.machines",
}


def first_request(db_url: str, target: str, method: str, body: bytes, headers: dict[str, str]) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": db_url,
        "LINEAR_WEBHOOK_SECRET": SECRET,
    }
    for name in ("DEVPILOT_METRICS", "PYDANTIC_DISABLE_PLUGINS"):  # (a fresh instance's environment)
        env.pop(name, None)
    return run_json(FIRST_REQUEST, target, method, body.decode(), json.dumps(headers), env=env)


def test_each_target_serves_its_first_request_without_what_it_does_not_need(
    db_url: str, make_orchestrator: MakeOrch
) -> None:
    orch = make_orchestrator(org_id="org-a", linear_user_id="user-1")
    auth = {"Authorization": f"Bearer {orch.token}", "Content-Type": "application/json"}
    hook = json.dumps(issue_event(issue_id="cold-1")).encode()
    requests: dict[str, tuple[str, bytes, dict[str, str], int]] = {
        "claim": ("POST", b'{"max": 1}', auth, 200),  # an idle machine's poll: nothing queued
        "ack": (
            "POST",
            json.dumps({"queueId": str(uuid4()), "claimToken": str(uuid4())}).encode(),
            auth,
            404,
        ),
        "healthz": ("GET", b"", {}, 200),
        "webhook": (
            "POST",
            hook,
            {"Linear-Signature": sign(SECRET, hook), "Content-Type": "application/json"},
            200,
        ),
    }
    for target, (method, body, headers, status) in requests.items():
        seen = first_request(db_url, target, method, body, headers)
        assert seen["status"] == status, (target, seen["body"])
        modules = set(seen["modules"])
        # The target's imports are out of the collector's walks (functions/main.py): even after the
        # first request, most of what the process holds was frozen when the target was loaded.
        assert seen["frozen"] > seen["collectable"], (target, seen["frozen"], seen["collectable"])
        # ...and the collector, off while the target was imported, is on again for what follows.
        assert seen["collecting"], target
        assert not modules & NOT_ON_FIRST_REQUEST, (target, sorted(modules & NOT_ON_FIRST_REQUEST))
        # The fleet's bodies are built by the targets that read one (functions/plain_body.py).
        assert ("functions.fleet_bodies" in modules) == (target in ("claim", "ack")), target
        if target == "webhook":  # (so the checks above are not vacuous: it loads what it uses)
            assert modules >= FLEET_NEVER - ROUTING_ON_USE
            # An issue's plain assignment: dispatched without the routing chain (loaded on use).
            assert not modules & ROUTING_ON_USE, sorted(modules & ROUTING_ON_USE)
        else:
            assert not modules & FLEET_NEVER, (target, sorted(modules & FLEET_NEVER))


def test_a_route_whose_body_is_a_pydantic_model_loads_it_without_reading_plugins(
    db_url: str, make_orchestrator: MakeOrch
) -> None:
    # (the first check above is not vacuous: a route of functions/bodies.py loads pydantic, and its
    # first model does not read every installed distribution's entry points for plugins)
    orch = make_orchestrator(org_id="org-a", linear_user_id="user-1")
    auth = {"Authorization": f"Bearer {orch.token}", "Content-Type": "application/json"}
    seen = first_request(db_url, "machine", "POST", b'{"repositories": [], "labels": []}', auth)
    assert seen["status"] == 200, seen["body"]
    assert {"pydantic", "functions.bodies"} <= set(seen["modules"])
    assert seen["plugins_read"] is False


@pytest.mark.parametrize("kind", ["uninstalled", "unroutable_agent_session"])
def test_a_webhook_that_needs_what_the_intake_loads_on_use_is_served_as_a_first_request(
    db_url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (ROUTING_ON_USE is imported where it is used: a cold instance's first such webhook still
    # does what it asks: the org disconnected (Linear's auth), Linear told the session is unroutable
    # (its notices))
    monkeypatch.setenv("LINEAR_CLIENT_ID", "client-id")
    if kind == "uninstalled":
        event, status, needs = app_revoked_event("org-cold"), "ignored", "shared.linear.auth"
    else:  # (an agent session nothing can take: no issue)
        event = agent_session_event(org="org-cold", creator="nobody", session_id="as-cold")
        del event["agentSession"]["issue"]
        status, needs = "ignored", "shared.linear.notices"
    hook = json.dumps(event).encode()
    headers = {"Linear-Signature": sign(SECRET, hook), "Content-Type": "application/json"}
    seen = first_request(db_url, "webhook", "POST", hook, headers)
    assert seen["status"] == 200, seen["body"]
    assert json.loads(seen["body"])["status"] == status, seen["body"]
    assert needs in set(seen["modules"])
