"""What the agent runners' end-to-end tests share: the pinned CLI (installed, or the test skips),
orchestrators that run `--agent NAME` (the agent's variables passed with --pass-env), what Linear
heard in an agent session, and the agent's processes as /proc shows them."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from devpilot.agent_clis import Pinned, Unavailable
from tests.helpers.api import Api, agent_session_event
from tests.helpers.linear import Linear
from tests.test_orchestrator import Orch, wait_for


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
        """Each orchestrator stopped, and the agents they started that still run (a COMMAND outlives
        its orchestrator's stop by design; a failed test must not leave one working)."""
        for o in self.started:
            if o.proc is not None and o.proc.poll() is None:
                o.stop()
            for pid, _ in _running(f"DEVPILOT_INBOX={o.state}{os.sep}".encode(), whole=False):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def said(linear: Linear, session: str) -> list[dict[str, Any]]:
    return [a for a in linear.activities() if a["agentSessionId"] == session]


def kinds(linear: Linear, session: str) -> list[str]:
    return [a["content"]["type"] for a in said(linear, session)]


def answers(linear: Linear, session: str) -> int:
    return kinds(linear, session).count("response")


def last_word(linear: Linear, session: str) -> dict[str, Any] | None:
    final = [a for a in said(linear, session) if a["content"]["type"] in ("response", "error")]
    return final[-1]["content"] if final else None


def begin(api: Api, session: str) -> None:
    """An agent session started in Linear (its own issue)."""
    api.webhook(agent_session_event(session_id=session, issue_id=f"i-{session}", body="go"))


def the_error(linear: Linear, session: str) -> str:
    """The `error` the agent session ended with, said once (not the orchestrator's too). Its text."""
    wait_for(lambda: last_word(linear, session) is not None, timeout=60, what=f"the error in {session}")
    word = last_word(linear, session)
    assert word is not None and word["type"] == "error", word
    assert kinds(linear, session).count("error") == 1, said(linear, session)
    return str(word["body"])


def first_action(linear: Linear, session: str) -> dict[str, Any]:
    """The first action Linear got in the session (its content)."""
    content: dict[str, Any] = next(
        a["content"] for a in said(linear, session) if a["content"]["type"] == "action"
    )
    return content


def unanswered(api: Api, linear: Linear) -> str:
    """An agent session (`as-wait`) whose agent asks a permission nobody answers: asked once, and
    the session goes on to its last word. The result Linear shows for the action asked about."""
    api.webhook(agent_session_event(session_id="as-wait", body="write it"))
    wait_for(lambda: last_word(linear, "as-wait") is not None, timeout=60, what="the answer")
    assert kinds(linear, "as-wait").count("elicitation") == 1
    return str(first_action(linear, "as-wait")["result"])


def asked(linear: Linear, session: str) -> str:
    """The elicitation the agent's permission prompt became, once posted: Linear's select with
    Allow and Deny. Its text."""
    wait_for(lambda: "elicitation" in kinds(linear, session), timeout=60, what="the question")
    [ask] = [a for a in said(linear, session) if a["content"]["type"] == "elicitation"]
    assert ask["signal"] == "select"
    assert [o["value"] for o in ask["signalMetadata"]["options"]] == ["Allow", "Deny"]
    body: str = ask["content"]["body"]
    return body


def pick(api: Api, session: str, issue_id: str, option: str) -> None:
    """The person picks `option` in Linear: a follow-up with the select signal."""
    api.webhook(
        agent_session_event(
            session_id=session,
            issue_id=issue_id,
            action="prompted",
            body=option,
            signal="select",
            signal_metadata={"value": option},
        )
    )


def allow_and_deny(
    api: Api, linear: Linear, made: Callable[[str], Path], about: Callable[[str], list[str]]
) -> None:
    """Two agent sessions, `as-allow` and `as-deny`, whose agents ask the same (a command that makes
    the file `made(case)`): each is asked in Linear (its text names each of `about(case)`) and
    nothing is made before the answer; the person allows one, denies the other; both end, and only
    the allowed file is made."""
    cases = ("allow", "deny")
    for case in cases:
        api.webhook(
            agent_session_event(session_id=f"as-{case}", issue_id=f"i-{case}", body=f"notes [{case}]")
        )
    for case in cases:
        question = asked(linear, f"as-{case}")
        assert all(words in question for words in about(case)), question
        assert not made(case).exists()  # nothing ran before the answer
        pick(api, f"as-{case}", f"i-{case}", "Allow" if case == "allow" else "Deny")
    for case in cases:
        wait_for(lambda c=case: last_word(linear, f"as-{c}") is not None, timeout=60, what="the answers")
    assert made("allow").exists()
    assert not made("deny").exists()


def processes(agent_session: str) -> list[tuple[int, list[bytes]]]:
    """The running processes whose environment names this agent session, with their argv."""
    return _running(f"DEVPILOT_AGENT_SESSION_ID={agent_session}".encode(), whole=True)


def _running(setting: bytes, whole: bool) -> list[tuple[int, list[bytes]]]:
    """The running processes with `setting` in their environment (the whole entry, or its start)."""
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
        if state != "Z" and any(e == setting if whole else e.startswith(setting) for e in environ):
            found.append((int(proc.name), argv))
    return found


def agent_pids(agent_session: str, program: str) -> list[int]:
    """The running processes of `program` (the end of its argv[0], or of argv[1]: a script's) of
    this agent session."""
    return [
        pid for pid, argv in processes(agent_session) if any(a.endswith(program.encode()) for a in argv[:2])
    ]
