"""Cold start (#17): a target imports what it needs, not every target's dependencies. The routes an
idle fleet calls all day (claim, ack) never load the HTTP client, the crypto library, the metrics
library or the Linear-facing modules; measured in bench/ (cold start), guarded here (and, serving a
real request, in tests/test_cloud_shape.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = [
    "httpx",
    "cryptography",
    "rich",
    "prometheus_client",
    "shared.linear",
    "shared.intake",
    "shared.notices",
    "shared.linear_auth",
]


def loaded_by(target: str) -> set[str]:
    # The target, and its route's module as its first request imports it.
    code = (
        "import sys, json, importlib, functions.main as m; from functions.routes import BY_NAME; "
        f"getattr(m, {target!r}); importlib.import_module(BY_NAME[{target!r}].module); "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("target", ["claim", "ack", "release", "healthz"])
def test_fleet_targets_do_not_load_what_only_linear_routes_need(target: str) -> None:
    assert not loaded_by(target) & set(HEAVY)


def test_the_webhook_target_loads_its_intake_when_it_first_answers() -> None:
    # (the check above would pass vacuously if nothing could ever load them; httpx itself waits
    # until a notice is sent: tests/test_cloud_shape.py)
    code = (
        "import sys, json, functions.webhook, shared.dispatch, shared.intake; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert {"shared.linear", "shared.intake", "shared.notices", "shared.linear_auth"} <= loaded
    assert "httpx" not in loaded
