"""The reference orchestrator in a conversation, as real processes: start and prompt run COMMAND
with the prompt; COMMAND talks to Linear with a token scoped to its agent session; its exit is
reported; Linear's stop ends its process group, also after the orchestrator was SIGKILLed; the
exit of a COMMAND an earlier (SIGKILLed) orchestrator started is reported once by the next one."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.agent_runs import agent_pids
from tests.helpers.api import Api, agent_session_event
from tests.helpers.linear import Linear
from tests.test_orchestrator import ROOT, Orch, wait_for

COMMAND = [sys.executable, str(ROOT / "tests/helpers/agent_command.py")]


@pytest.fixture
def machine(api: Api, tmp_path: Path) -> Any:
    made: list[Orch] = []

    def make() -> tuple[Orch, str]:
        _, token = api.register(user="user-1", name="laptop")
        o = Orch(api.url, token, tmp_path, extra=["--stop-grace", "2"], command=COMMAND)
        made.append(o)
        return o, token

    yield make
    for o in made:
        if o.proc is not None and o.proc.poll() is None:
            o.proc.kill()
            o.proc.wait()


def wait_said(linear: Linear, session: str, kind: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t, body in linear.said(session):
            if t == kind:
                return body
        time.sleep(0.05)
    raise AssertionError(f"no {kind} for {session}: {linear.said(session)}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_start_then_prompt_with_the_agents_own_activity(api: Api, linear: Linear, machine: Any) -> None:
    o, token = machine()
    o.start()
    event = agent_session_event(session_id="as-c1", body="please [talk]")
    api.webhook(event)
    assert wait_said(linear, "as-c1", "response") == "Finished."
    thoughts = [b for t, b in linear.said("as-c1") if t == "thought"]
    assert f"working on: {event['promptContext']}" in thoughts  # COMMAND's own, through its scoped token
    [first] = o.starts()
    assert first["kind"] == "start" and first["env"]["DEVPILOT_KIND"] == "start"
    assert (
        first["env"]["DEVPILOT_AGENT_SESSION_ID"] == "as-c1"
        and first["env"]["DEVPILOT_PROMPT"] == event["promptContext"]  # Linear's request
    )
    assert first["env"]["DEVPILOT_AGENT_TOKEN"].startswith("dpa.")
    assert token not in str(first["allEnv"]) and "DEVPILOT_ORCHESTRATOR_TOKEN" not in first["allEnv"]

    api.webhook(agent_session_event(session_id="as-c1", action="prompted", body="[talk] again"))
    wait_for(lambda: len(o.starts()) == 2, what="the follow-up started")
    second = o.starts()[1]
    assert second["kind"] == "prompt" and second["env"]["DEVPILOT_PROMPT"] == "[talk] again"
    wait_for(lambda: [t for t, _ in linear.said("as-c1")].count("response") == 2, what="second response")
    assert o.stop() == 0


def test_a_failing_command_reports_an_error_with_its_output(api: Api, linear: Linear, machine: Any) -> None:
    o, _ = machine()
    o.start()
    api.webhook(agent_session_event(session_id="as-c2", body="please [fail]"))
    error = wait_said(linear, "as-c2", "error")
    assert "exited with code 3" in error and "boom: the build is broken" in error
    assert "response" not in [t for t, _ in linear.said("as-c2")]
    assert o.stop() == 0


def running(api: Api, machine: Any, session: str, body: str) -> tuple[Orch, int]:
    """An orchestrator started, and the pid of the COMMAND it runs for a start with `body`."""
    o, _ = machine()
    o.start()
    api.webhook(agent_session_event(session_id=session, body=body))
    wait_for(lambda: len(o.starts()) == 1, what="the agent running")
    return o, o.starts()[0]["pid"]


def test_stop_ends_the_running_agent_and_posts_the_final_response(
    api: Api, linear: Linear, machine: Any
) -> None:
    o, pid = running(api, machine, "as-c3", "please [sleep]")
    assert alive(pid)
    t0 = time.monotonic()
    r = api.webhook(agent_session_event(session_id="as-c3", action="prompted", signal="stop")).json()
    assert r["status"] == "stopped" and r["stopSessionId"]
    assert wait_said(linear, "as-c3", "response") == "Stopped, as asked in Linear."
    assert not alive(pid) and time.monotonic() - t0 < 15
    time.sleep(0.5)
    assert "error" not in [t for t, _ in linear.said("as-c3")]  # a stopped agent is not a failure
    assert len(o.starts()) == 1  # the stop started nothing
    assert o.stop() == 0


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError):
        return 0


def test_stop_ends_what_the_agent_started_in_a_session_of_its_own(
    api: Api, linear: Linear, machine: Any
) -> None:
    """A command the agent runs in a session of its own (codex runs each shell command so) is out of
    reach of its process group's signals: the stop ends it too, before it says the agent stopped."""
    o, pid = running(api, machine, "as-c5", "please [detach]")

    def started_by_it() -> list[int]:  # (its child: not one an earlier run of this test left)
        return [p for p in agent_pids("as-c5", "sleep") if parent(p) == pid]

    wait_for(started_by_it, what="the detached command running")
    [detached] = started_by_it()
    api.webhook(agent_session_event(session_id="as-c5", action="prompted", signal="stop"))
    wait_for(lambda: "stopped agent session as-c5" in o.log(), timeout=30, what="the stop")
    assert not alive(pid) and not alive(detached)
    assert o.stop() == 0


def test_stop_finds_an_agent_started_before_the_orchestrator_was_sigkilled(
    api: Api, linear: Linear, machine: Any
) -> None:
    o, pid = running(api, machine, "as-c4", "please [sleep]")
    o.signal(signal.SIGKILL)
    assert o.proc is not None
    o.proc.wait()
    assert alive(pid)  # COMMAND lives on in its own session
    o.start()
    api.webhook(agent_session_event(session_id="as-c4", action="prompted", signal="stop"))
    assert wait_said(linear, "as-c4", "response") == "Stopped, as asked in Linear."
    wait_for(lambda: not alive(pid), timeout=10, what="the old agent ended")
    assert len(o.starts()) == 1
    assert o.stop() == 0


def restarted_while_held(api: Api, machine: Any, session: str, body: str) -> tuple[Orch, int]:
    """An orchestrator SIGKILLed while its COMMAND ("[hold]") runs, and started again."""
    o, pid = running(api, machine, session, body)
    o.signal(signal.SIGKILL)
    assert o.proc is not None
    o.proc.wait()
    assert alive(pid)
    o.start()
    wait_for(lambda: "started before the orchestrator restarted" in o.log(), what="the old agent watched")
    return o, pid


def finals(linear: Linear, session: str) -> list[tuple[str, str]]:
    """What Linear heard but thoughts (the service's own "Queued for ...", COMMAND's)."""
    return [(t, body) for t, body in linear.said(session) if t != "thought"]


def release(o: Orch) -> None:
    Path(f"{o.started_file}.release").touch()


def test_an_agent_started_before_a_sigkill_that_exits_0_is_answered_finished_once(
    api: Api, linear: Linear, machine: Any
) -> None:
    o, pid = restarted_while_held(api, machine, "as-c5", "please [hold]")
    assert finals(linear, "as-c5") == []
    release(o)
    assert wait_said(linear, "as-c5", "response") == "Finished."
    wait_for(lambda: not alive(pid), timeout=10, what="the old agent ended")
    time.sleep(1.5)  # (a second report would come within a loop or two)
    assert finals(linear, "as-c5") == [("response", "Finished.")]
    assert len(o.starts()) == 1
    assert o.stop() == 0


def test_an_agent_started_before_a_sigkill_that_exits_3_reports_the_error_then_the_follow_up_runs(
    api: Api, linear: Linear, machine: Any
) -> None:
    o, pid = restarted_while_held(api, machine, "as-c6", "please [hold] [fail]")
    api.webhook(agent_session_event(session_id="as-c6", action="prompted", body="[talk] again"))
    time.sleep(1.5)
    assert alive(pid) and len(o.starts()) == 1  # the follow-up waits while the old agent runs
    release(o)
    error = wait_said(linear, "as-c6", "error")
    assert "exited with code 3" in error and "boom: the build is broken" in error
    wait_for(lambda: len(o.starts()) == 2, what="the follow-up started")
    assert o.starts()[1]["env"]["DEVPILOT_PROMPT"] == "[talk] again"
    assert wait_said(linear, "as-c6", "response") == "Finished."
    time.sleep(1.5)
    assert [t for t, _ in finals(linear, "as-c6")] == ["error", "response"]
    assert o.stop() == 0


def test_an_agent_started_before_a_sigkill_whose_launcher_is_killed_too_is_an_unknown_exit(
    api: Api, linear: Linear, machine: Any
) -> None:
    o, pid = restarted_while_held(api, machine, "as-c7", "please [hold]")
    mid = o.starts()[0]["messageId"]
    launcher = int((o.state / "started" / mid).read_text())
    os.killpg(launcher, signal.SIGKILL)  # the launcher and COMMAND: nothing records the exit
    error = wait_said(linear, "as-c7", "error")
    assert "exit code is unknown" in error and not alive(pid)
    assert not (o.state / "exited" / mid).exists()
    time.sleep(1.5)
    assert [t for t, _ in finals(linear, "as-c7")] == ["error"]
    assert o.stop() == 0
