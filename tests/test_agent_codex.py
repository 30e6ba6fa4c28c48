"""`devpilot-orchestrator --agent codex`, end to end and real: a Linear webhook into the real
service, the queue, the real orchestrator, `devpilot-agent codex`, the real `codex app-server` (the
pinned version: tests/helpers/codex.py), its real tools in the working directory, and what Linear
gets (the stand-in Linear checks every call against Linear's schema). The model is the scripted
stand-in of the Responses API (devpilot/scripted_responses.py), which records what codex sends it.
The rest of the mapping is tested on recorded app-server streams (tests/unit/test_codex_events.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devpilot.scripted_model import Recorded
from devpilot.scripted_responses import (
    Call,
    Message,
    Patch,
    Reasoning,
    Reply,
    ScriptedResponses,
    last_user_text,
    outputs,
    step,
    texts,
)
from tests.helpers import agent_runs as runs
from tests.helpers.api import Api, agent_session_event
from tests.helpers.codex import PASSED, cli, environment
from tests.helpers.linear import Linear
from tests.test_orchestrator import Orch, wait_for


def run(command: str) -> Call:
    return Call("exec_command", {"cmd": command, "login": False})


def turn_metadata(request: Recorded) -> dict[str, Any]:
    """What codex says of the request's turn (its thread, its turn, its sandbox)."""
    given = {k.lower(): v for k, v in request.headers.items()}
    metadata: dict[str, Any] = json.loads(given["x-codex-turn-metadata"])
    return metadata


def carrying(model: ScriptedResponses, text: str) -> Recorded | None:
    """The first request whose person's words are `text`."""
    return next((r for r in list(model.requests) if r.agent and text in last_user_text(r.body)), None)


@pytest.fixture
def running(api: Api, linear: Linear, tmp_path: Path, repo: Path) -> Iterator[Any]:
    """Starts an orchestrator with `--agent codex` (or another COMMAND) for the test, passing codex
    its CODEX_HOME (a config.toml making the stand-in its model provider) and key."""
    codex = cli()  # (installed, or the test skips, before anything is registered)
    machines = runs.Orchestrators(api, tmp_path, repo)

    def start(
        model: ScriptedResponses | str, *flags: str, path: str | None = None, command: list[str] | None = None
    ) -> Orch:
        env = {**environment(model, tmp_path / "home"), "PATH": path or runs.path_with(codex)}
        return machines.start(env, PASSED, command or ["--agent", "codex", *flags])

    yield start
    machines.stop_all()
    assert not linear.invalid, linear.invalid


def test_an_issue_is_worked_on_by_the_real_codex_live_in_linear(
    api: Api, linear: Linear, running: Any, repo: Path
) -> None:
    """webhook -> queue -> orchestrator -> devpilot-agent -> codex app-server -> a real command and
    a real patch in the conversation's worktree -> thoughts, actions with results, the plan and the
    response in Linear."""
    replies = [
        Reply(
            [
                Reasoning("Looking at the repository first."),
                Message("I'll plan, then look."),
                Call(
                    "update_plan",
                    {
                        "plan": [
                            {"step": "Read the code", "status": "in_progress"},
                            {"step": "Write the fix", "status": "pending"},
                        ]
                    },
                ),
            ]
        ),
        Reply([run("git branch --show-current && ls")]),
        Reply(
            [
                Patch(
                    "*** Begin Patch\n*** Add File: fix.py\n+def total(items):\n+    return sum(items)\n*** End Patch\n"
                )
            ]
        ),
        Reply(
            [
                Call(
                    "update_plan",
                    {
                        "plan": [
                            {"step": "Read the code", "status": "completed"},
                            {"step": "Write the fix", "status": "in_progress"},
                        ]
                    },
                )
            ]
        ),
        Reply([Message("The branch is named for ENG-7; the fix is in fix.py.")]),
    ]
    model = ScriptedResponses(lambda request: replies[min(step(request), len(replies) - 1)])
    try:
        o = running(model, "--worktree")
        api.webhook(agent_session_event(session_id="as-live", body="Please fix the cart"))
        wait_for(lambda: runs.last_word(linear, "as-live") is not None, timeout=90, what="the agent's answer")
        assert runs.last_word(linear, "as-live") == {
            "type": "response",
            "body": "The branch is named for ENG-7; the fix is in fix.py.",
        }
        shown = [a["content"] for a in runs.said(linear, "as-live")]
        thoughts = [c["body"] for c in shown if c["type"] == "thought"]
        assert "Looking at the repository first.\n\nI'll plan, then look." in thoughts  # (merged)
        actions = [(c["action"], c["parameter"], c["result"]) for c in shown if c["type"] == "action"]
        # The real command ran in the conversation's own worktree, on the branch named for the issue,
        # and the patch wrote the file there.
        assert actions == [
            ("Run", "git branch --show-current && ls", "devpilot/eng-7-as-live\nREADME"),
            ("Create", "fix.py", "fix.py +2"),
        ]
        worktree = o.state / "worktrees" / "as-live"
        assert (worktree / "fix.py").read_text() == "def total(items):\n    return sum(items)\n"
        # The agent's to-do list is the session's plan, as Linear documents its shape.
        assert linear.sessions["as-live"]["plan"] == [
            {"content": "Read the code", "status": "completed"},
            {"content": "Write the fix", "status": "inProgress"},
        ]
        # The request was its first user turn: Linear's promptContext; codex ran sandboxed.
        first = next(r for r in model.requests if r.agent)
        assert "Please fix the cart" in last_user_text(first.body)
        assert turn_metadata(first)["sandbox_mode"] == "workspace-write"
        assert len(model.agent_requests) == len(replies)
    finally:
        model.close()


def escalated(case: str, outside: Path) -> Reply:
    """A command the sandbox does not allow: codex asks its client (the runner) first."""
    command = f"touch {outside}/made-by-{case}.txt && echo written"
    arguments = {
        "cmd": command,
        "login": False,
        "sandbox_permissions": "require_escalated",
        "justification": "Write the notes outside the checkout",
    }
    return Reply([Message("Writing the notes."), Call("exec_command", arguments)])


def test_an_approval_is_asked_in_linear_and_the_persons_pick_decides(
    api: Api, linear: Linear, running: Any, tmp_path: Path
) -> None:
    """codex asks to run a command outside its sandbox: a select elicitation in Linear; Allow lets
    it run, Deny does not, and the model's next request carries the outcome."""
    outside = tmp_path / "outside"
    outside.mkdir()

    def script(request: dict[str, Any]) -> Reply:
        case = "allow" if "[allow]" in texts(request) else "deny"
        if step(request) == 0:
            return escalated(case, outside)
        return Reply([Message(f"Outcome: {outputs(request)[-1]}")])

    model = ScriptedResponses(script)
    try:
        running(model)
        runs.allow_and_deny(
            api,
            linear,
            lambda case: outside / f"made-by-{case}.txt",
            lambda case: [
                f"`touch {outside}/made-by-{case}.txt && echo written`",
                "Write the notes outside the checkout",
            ],
        )
        outcome = {
            case: next(outputs(r)[-1] for r in model.agent_requests if f"[{case}]" in texts(r) and step(r))
            for case in ("allow", "deny")
        }
        assert "written" in outcome["allow"]
        assert "rejected by user" in outcome["deny"]
        assert runs.first_action(linear, "as-deny")["result"] == "Error: Denied by the person in Linear."
    finally:
        model.close()


def test_an_approval_nobody_answers_is_declined_after_the_approval_timeout_and_linear_told(
    api: Api, linear: Linear, running: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    def script(request: dict[str, Any]) -> Reply:
        return (
            escalated("wait", outside)
            if step(request) == 0
            else Reply([Message(f"Outcome: {outputs(request)[-1]}")])
        )

    model = ScriptedResponses(script)
    try:
        running(model, "--approval-timeout", "2")
        assert runs.unanswered(api, linear) == "Error: No answer in Linear within 2 seconds: not allowed."
        assert "rejected by user" in outputs(model.agent_requests[1])[-1]
        assert not (outside / "made-by-wait.txt").exists()
    finally:
        model.close()


def codex_pids(agent_session: str) -> list[int]:
    """The app-server of this agent session (the native binary; its npm launcher too, if it ran)."""
    return [pid for pid, argv in runs.processes(agent_session) if b"app-server" in argv[:3]]


def test_a_follow_up_reaches_the_running_turn_and_later_commands_resume_the_thread(
    api: Api, linear: Linear, running: Any, tmp_path: Path
) -> None:
    """A follow-up written while codex works reaches the same turn of the same process (steered:
    the model's next request of that turn carries it); after it exits, and after the orchestrator
    is SIGKILLed mid-run, the next COMMAND resumes the thread (the model sees the earlier turns); a
    stop ends it within the grace and the thread still resumes; a thread codex lost starts anew."""

    def script(request: dict[str, Any]) -> Reply:
        last = last_user_text(request)
        if "Also the EMPTY CART" in last:
            return Reply([Message("Covered the empty cart too.")])
        if "[hold]" in last:  # (a turn in flight until codex has something to add)
            return Reply([Reasoning("Working on the cart.")], hold=60)
        if "[work]" in last and step(request) == 0:
            return Reply([Message("A moment."), run("sleep 3")])
        if "[long]" in last and step(request) == 0:
            return Reply([Message("A long one."), run("sleep 30")])
        return Reply([Message(f"Answered: {last}")])

    model = ScriptedResponses(script)

    def follow_up(text: str) -> Recorded:
        """Said in Linear: the model's request that carries it, once codex sent it."""
        api.webhook(agent_session_event(session_id="as-resume-codex", action="prompted", body=text))
        wait_for(lambda: carrying(model, text) is not None, 60, repr(text))
        found = carrying(model, text)
        assert found is not None
        return found

    try:
        o = running(model)
        conversation = o.state / "conversations" / "as-resume-codex"
        # 1. a follow-up while codex works: steered into the same turn of the same process
        api.webhook(agent_session_event(session_id="as-resume-codex", body="Remember ZEBRA [hold]"))
        wait_for(
            lambda: carrying(model, "Remember ZEBRA") is not None, timeout=60, what="codex's first request"
        )
        first = carrying(model, "Remember ZEBRA")
        assert first is not None
        steered = follow_up("Also the EMPTY CART")
        assert turn_metadata(steered)["turn_id"] == turn_metadata(first)["turn_id"]  # the same turn
        assert "Remember ZEBRA" in texts(steered.body)
        wait_for(
            lambda: runs.last_word(linear, "as-resume-codex") is not None, timeout=60, what="the first answer"
        )
        assert runs.last_word(linear, "as-resume-codex") == {
            "type": "response",
            "body": "Covered the empty cart too.",
        }
        assert o.log().count("started ENG-7") == 1  # one COMMAND took both
        thread = json.loads((conversation / "agent-codex.json").read_text())["threadId"]
        assert turn_metadata(first)["thread_id"] == thread
        assert not list((conversation / "inbox").glob("*.json"))  # taken in

        # 2. after it exited: the next COMMAND resumes the thread
        resumed = follow_up("What came first?")
        assert o.log().count("started ENG-7") == 2
        assert turn_metadata(resumed)["thread_id"] == thread
        assert "Remember ZEBRA" in texts(resumed.body) and "Also the EMPTY CART" in texts(resumed.body)
        wait_for(lambda: runs.answers(linear, "as-resume-codex") == 2, timeout=60, what="the second answer")

        # 3. the orchestrator SIGKILLed while codex works; restarted; the next COMMAND resumes
        follow_up("Then more [work]")
        o.signal(signal.SIGKILL)
        assert o.proc is not None and o.proc.wait(timeout=10) == -signal.SIGKILL
        o.start()
        wait_for(
            lambda: runs.answers(linear, "as-resume-codex") == 3, timeout=60, what="codex finishing alone"
        )
        banana = follow_up("And BANANA?")
        assert "Remember ZEBRA" in texts(banana.body) and "Then more [work]" in texts(banana.body)
        assert turn_metadata(banana)["thread_id"] == thread
        assert o.log().count("started ENG-7") == 4  # a COMMAND of its own, after the restart

        # 4. Linear's stop while a long command runs: ended within the grace, resumable later
        wait_for(lambda: runs.answers(linear, "as-resume-codex") == 4, timeout=60, what="the answer")
        follow_up("Now the [long] job")
        wait_for(
            lambda: runs.agent_pids("as-resume-codex", "sleep"), timeout=30, what="the long command running"
        )
        api.webhook(agent_session_event(session_id="as-resume-codex", action="prompted", signal="stop"))
        wait_for(lambda: "stopped agent session as-resume-codex" in o.log(), timeout=30, what="the stop")
        assert not codex_pids("as-resume-codex")
        assert not runs.agent_pids("as-resume-codex", "sleep")  # (interrupted: its command ended with it)
        # It ended by itself within the grace (interrupted, stdin closed), not SIGKILLed after it.
        assert o.log().rsplit("finished with exit code", 1)[1].split()[0] == "0"
        after = follow_up("Where were we?")
        assert "Now the [long] job" in texts(after.body) and "sleep 30" in texts(after.body)
        assert "<turn_aborted>" in texts(after.body)  # (the model knows the person stopped that turn)
        assert turn_metadata(after)["thread_id"] == thread

        # 5. a thread codex no longer has (its history removed): a new one, pointed at the transcript
        wait_for(
            lambda: runs.answers(linear, "as-resume-codex") == 6, timeout=60, what="the answer after the stop"
        )
        shutil.rmtree(tmp_path / "home" / "codex" / "sessions")
        fresh = follow_up("Start over?")
        wait_for(
            lambda: runs.answers(linear, "as-resume-codex") == 7, timeout=60, what="the new thread's answer"
        )
        assert "Remember ZEBRA" not in texts(fresh.body)
        assert "This continues a conversation from Linear" in last_user_text(fresh.body)
        assert str(conversation / "transcript.jsonl") in last_user_text(fresh.body)
        assert turn_metadata(fresh)["thread_id"] != thread
        assert runs.kinds(linear, "as-resume-codex").count("error") == 0
    finally:
        model.close()


def test_a_refused_key_and_a_crash_are_errors_that_name_the_cause_and_no_codex_outlives_its_runner(
    api: Api, linear: Linear, running: Any
) -> None:
    model = ScriptedResponses(lambda r: Reply([Message("Working."), run("sleep 20")]))
    try:
        running(model)
        # a crash: codex killed mid-run
        runs.begin(api, "as-crash-codex")
        wait_for(lambda: runs.agent_pids("as-crash-codex", "sleep"), timeout=60, what="codex at work")
        for pid in codex_pids("as-crash-codex"):
            os.kill(pid, signal.SIGKILL)
        assert runs.the_error(linear, "as-crash-codex").startswith(
            "Codex was killed by signal 9 before it finished."
        )
        # the runner killed: codex goes with it (no orphan still working)
        runs.begin(api, "as-orphan")
        wait_for(lambda: runs.agent_pids("as-orphan", "sleep"), timeout=60, what="codex at work")
        [runner] = runs.agent_pids("as-orphan", "devpilot-agent")
        os.kill(runner, signal.SIGKILL)
        wait_for(lambda: not codex_pids("as-orphan"), timeout=10, what="codex ended with its runner")
        # the model's API refusing the key (401): said once, naming it
        model.key = "sk-another-key"
        runs.begin(api, "as-401")
        refused = runs.the_error(linear, "as-401")
        assert "refused Codex's credentials (HTTP 401)" in refused
        assert "Incorrect API key provided" in refused and "--pass-env" in refused
        wait_for(lambda: not codex_pids("as-401"), timeout=30, what="codex ended")
    finally:
        model.close()


def test_codex_missing_or_refusing_its_flags_is_an_error_that_says_why(
    api: Api, linear: Linear, running: Any
) -> None:
    o = running("http://127.0.0.1:9", path="/usr/bin:/bin")  # (not the PATH codex is installed on)
    runs.begin(api, "as-missing")
    missing = runs.the_error(linear, "as-missing")
    assert "Codex is not installed on this machine: `codex` is not on the PATH" in missing
    assert "npm install -g @openai/codex@0.171.0" in missing
    o.stop()
    running("http://127.0.0.1:9", '--agent-arg=--config=model_provider="nowhere"')  # (the person's flag)
    runs.begin(api, "as-flags")
    refused = runs.the_error(linear, "as-flags")
    assert refused.startswith("Codex exited with code 1 before it finished.")
    assert "Model provider `nowhere` not found" in refused  # (its stderr's last lines)


def test_a_model_api_that_never_answers_ends_the_run_after_the_model_api_timeout(
    api: Api, linear: Linear, running: Any
) -> None:
    """codex retries an unreachable API without end; the runner ends the run and says why."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    runner = [str(Path(sys.executable).parent / "devpilot-agent"), "--model-api-timeout", "3", "codex"]
    running(nowhere, command=["--", *runner])
    runs.begin(api, "as-down")
    assert runs.the_error(linear, "as-down").startswith(
        "The model's API has not answered Codex for 3 seconds"
    )
    wait_for(lambda: not codex_pids("as-down"), timeout=30, what="codex ended")
