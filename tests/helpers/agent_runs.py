"""What the agent runners' end-to-end tests share: the pinned CLI (installed, or the test skips),
orchestrators that run `--agent NAME` (the agent's variables passed with --pass-env), what Linear
heard in an agent session, and the agent's processes as /proc shows them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from devpilot.agent_clis import Pinned, Unavailable
from tests.helpers.api import Api
from tests.helpers.linear import Linear
from tests.test_orchestrator import Orch


def pinned_cli(cli: Pinned) -> Path:
    """The pinned CLI, installed if it is not yet; the test skips when it cannot be (and fails
    instead under DEVPILOT_REQUIRE_AGENT_CLIS=1, as in CI, which installs it first)."""
    try:
        return cli.install()
    except Unavailable as exc:
        if os.environ.get("DEVPILOT_REQUIRE_AGENT_CLIS") == "1":
            pytest.fail(f"DEVPILOT_REQUIRE_AGENT_CLIS=1, but {exc}")
        pytest.skip(str(exc))


def path_with(cli_path: Path) -> str:
    return os.pathsep.join([str(cli_path.parent), os.environ.get("PATH", os.defpath)])


class Orchestrators:
    """Agent orchestrators of one machine (registered once) in the checkout `repo`; each stopped at
    the end (`stop_all`)."""

    def __init__(self, api: Api, tmp_path: Path, repo: Path) -> None:
        _, self.token = api.register(user="user-1", name="laptop")
        self.api_url, self.tmp_path, self.repo = api.url, tmp_path, repo
        self.started: list[Orch] = []

    def start(self, env: dict[str, str], passed: list[str], command: list[str]) -> Orch:
        """`command`: `--agent NAME FLAG...`, or `-- devpilot-agent ...`; `passed`: the variables of
        `env` the agent gets (--pass-env)."""
        tmp = self.tmp_path / f"o{len(self.started)}"
        tmp.mkdir()
        o = Orch(self.api_url, self.token, tmp, cwd=self.repo, env=env, extra=["--stop-grace", "4"])
        head = o.args[: o.args.index("--")]
        o.args = [*head, *[x for name in passed for x in ("--pass-env", name)], *command]
        o.start()
        self.started.append(o)
        return o

    def stop_all(self) -> None:
        for o in self.started:
            if o.proc is not None and o.proc.poll() is None:
                o.stop()


def said(linear: Linear, session: str) -> list[dict[str, Any]]:
    return [a for a in linear.activities() if a["agentSessionId"] == session]


def kinds(linear: Linear, session: str) -> list[str]:
    return [a["content"]["type"] for a in said(linear, session)]


def answers(linear: Linear, session: str) -> int:
    return kinds(linear, session).count("response")


def last_word(linear: Linear, session: str) -> dict[str, Any] | None:
    final = [a for a in said(linear, session) if a["content"]["type"] in ("response", "error")]
    return final[-1]["content"] if final else None


def processes(agent_session: str) -> list[tuple[int, list[bytes]]]:
    """The running processes whose environment names this agent session, with their argv."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and f"DEVPILOT_AGENT_SESSION_ID={agent_session}".encode() in environ:
            found.append((int(proc.name), argv))
    return found


def agent_pids(agent_session: str, program: str) -> list[int]:
    """The running processes of `program` (the end of its argv[0], or of argv[1]: a script's) of
    this agent session."""
    return [
        pid for pid, argv in processes(agent_session) if any(a.endswith(program.encode()) for a in argv[:2])
    ]
