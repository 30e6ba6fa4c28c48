"""The real `codex` CLI in tests, offline: the pinned version (installed by devpilot.agent_clis
into its cache folder on first use; without npm the tests skip and say why), a HOME and a
CODEX_HOME of its own (its config, threads and logins, never the person's), whose config.toml
makes the scripted stand-in of the Responses API (devpilot.scripted_responses) its model provider."""

from __future__ import annotations

from pathlib import Path

from devpilot.agent_clis import CODEX
from devpilot.scripted_responses import KEY, KEY_ENV, ScriptedResponses, codex_config
from tests.helpers.agent_runs import pinned_cli

# What the orchestrator passes its agent (--pass-env): where codex keeps its config and threads,
# and the key its model provider reads.
PASSED = ["CODEX_HOME", KEY_ENV]


def cli() -> Path:
    """The pinned CLI's `codex` (the npm launcher; the runner starts the native binary beside it)."""
    return pinned_cli(CODEX)


def environment(model: ScriptedResponses | str, home: Path, key: str = KEY) -> dict[str, str]:
    """The CLI's variables: HOME, CODEX_HOME (its config.toml pointing at `model`, or at an
    address), and the key."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    url = model if isinstance(model, str) else model.url
    (codex_home / "config.toml").write_text(codex_config(url))
    return {"HOME": str(home), "CODEX_HOME": str(codex_home), KEY_ENV: key}
