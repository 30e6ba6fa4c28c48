"""The login the CLI stores, and what later runs take from it (no service needed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from orchestrator.options import fill
from orchestrator.state import forget, store, stored


def args(state: Path, **given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"token": None, "url": None, "endpoints": None, "state_dir": state, **given})


def test_the_stored_login_is_owner_only_and_later_runs_take_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    path = store(state, {"url": "https://d.example", "token": "dpo_saved", "orchestratorId": "o-1"})
    assert path.stat().st_mode & 0o777 == 0o600 and state.stat().st_mode & 0o777 == 0o700
    assert [p.name for p in state.iterdir()] == ["login.json"]  # no temporary file left behind
    run = args(state)
    fill(run)
    assert (run.token, run.url) == ("dpo_saved", "https://d.example")
    # --token (or DEVPILOT_ORCHESTRATOR_TOKEN, its default) and --url win over the stored login
    given = args(state, token="dpo_given")
    fill(given)
    assert (given.token, given.url) == ("dpo_given", None)
    elsewhere = args(state, url="https://other.example")
    fill(elsewhere)
    assert (elsewhere.token, elsewhere.url) == ("dpo_saved", "https://other.example")
    mapped = args(state, endpoints='{"claim": "https://c", "ack": "https://a"}')
    fill(mapped)
    assert mapped.url is None and json.loads(mapped.endpoints)["claim"] == "https://c"
    forget(state)
    assert stored(state) is None
    nothing = args(state)
    fill(nothing)
    assert nothing.token is None and nothing.url is None


def test_a_login_from_a_cloud_deploy_keeps_its_endpoints(tmp_path: Path) -> None:
    store(
        tmp_path,
        {"url": "https://d", "token": "dpo_x", "endpoints": {"claim": "https://c", "ack": "https://a"}},
    )
    run = args(tmp_path)
    fill(run)
    assert run.url == "https://d" and json.loads(run.endpoints) == {"claim": "https://c", "ack": "https://a"}
