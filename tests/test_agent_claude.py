"""`devpilot-orchestrator --agent claude`, end to end and real: a Linear webhook into the real
service, the queue, the real orchestrator, `devpilot-agent claude`, the real `claude` CLI (the
pinned version: tests/helpers/claude.py), its real tools in the working directory, and what Linear
gets (the stand-in Linear checks every call against Linear's schema). The model is the scripted
stand-in of the Messages API (devpilot/scripted_model.py), which records what the CLI sends it.
The rest of the mapping is tested on the CLI's recorded streams (tests/unit/test_claude_stream.py)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devpilot.scripted_model import Block, ScriptedModel, Text, ToolUse, last_user_text, texts
from tests.helpers.agent_runs import (
    Orchestrators,
    agent_pids,
    allow_and_deny,
    answers,
    begin,
    first_action,
    kinds,
    last_word,
    path_with,
    said,
    the_error,
    unanswered,
)
from tests.helpers.api import Api, agent_session_event
from tests.helpers.claude import PASSED, cli, environment
from tests.helpers.linear import Linear
from tests.test_orchestrator import Orch, wait_for

SLEEPS = "--agent-arg=--allowedTools=Bash(sleep:*)"  # (the person's flags reach the CLI)


def turns(request: dict[str, Any]) -> int:
    """How many replies of the model the request already holds."""
    return sum(1 for m in request.get("messages") or [] if m.get("role") == "assistant")


@pytest.fixture
def running(api: Api, linear: Linear, tmp_path: Path, repo: Path) -> Iterator[Any]:
    """Starts an orchestrator with `--agent claude` for the test (stopped after it), passing the
    CLI its API (the stand-in), key and quiet switches, with a HOME of its own."""
    claude = cli()  # (installed, or the test skips, before anything is registered)
    machines = Orchestrators(api, tmp_path, repo)

    def start(model: ScriptedModel, *flags: str, path: str | None = None) -> Orch:
        env = {**environment(model, tmp_path / "home"), "PATH": path or path_with(claude)}
        return machines.start(env, PASSED, ["--agent", "claude", *flags])

    yield start
    machines.stop_all()
    assert not linear.invalid, linear.invalid


def test_an_issue_is_worked_on_by_the_real_cli_live_in_linear(
    api: Api, linear: Linear, running: Any, repo: Path
) -> None:
    """webhook -> queue -> orchestrator -> devpilot-agent -> claude -> a real Bash call in the
    conversation's worktree -> thoughts, actions with results, the plan and the response in Linear."""
    replies: list[list[Block]] = [
        [Text("Looking at the repository."), ToolUse("Bash", {"command": "git branch --show-current && ls"})],
        [ToolUse("ToolSearch", {"query": "select:TaskCreate,TaskUpdate"})],
        [
            ToolUse("TaskCreate", {"subject": "Read the code", "description": "read"}),
            ToolUse("TaskCreate", {"subject": "Write the fix", "description": "fix"}),
        ],
        [
            ToolUse("TaskUpdate", {"taskId": "1", "status": "completed"}),
            ToolUse("TaskUpdate", {"taskId": "2", "status": "in_progress"}),
            ToolUse("Bash", {"command": "pwd"}),
        ],
        [Text("The branch is named for ENG-7; the fix is next.")],
    ]
    model = ScriptedModel(lambda request: replies[min(turns(request), len(replies) - 1)])
    try:
        o = running(model, "--worktree")
        api.webhook(agent_session_event(session_id="as-live", body="Please fix the cart"))
        wait_for(lambda: last_word(linear, "as-live") is not None, timeout=90, what="the agent's answer")
        assert last_word(linear, "as-live") == {
            "type": "response",
            "body": "The branch is named for ENG-7; the fix is next.",
        }
        mine = [a["content"] for a in said(linear, "as-live") if a["content"]["type"] != "thought"]
        actions = [c for c in mine if c["type"] == "action"]
        assert [(c["action"], c["parameter"]) for c in actions] == [
            ("Bash", "git branch --show-current && ls"),
            ("Bash", "pwd"),
        ]
        # The real command ran in the conversation's own worktree, on the branch named for the issue.
        assert actions[0]["result"].splitlines() == ["devpilot/eng-7-as-live", "README"]
        assert actions[1]["result"] == str(o.state / "worktrees" / "as-live")
        thoughts = [
            a["content"]["body"] for a in said(linear, "as-live") if a["content"]["type"] == "thought"
        ]
        assert "Looking at the repository." in thoughts
        # The agent's to-do list is the session's plan, as Linear documents its shape.
        assert linear.sessions["as-live"]["plan"] == [
            {"content": "Read the code", "status": "completed"},
            {"content": "Write the fix", "status": "inProgress"},
        ]
        # The request was its first user turn: Linear's promptContext.
        first = model.agent_requests[0]
        assert "Please fix the cart" in last_user_text(first)
        assert len(model.agent_requests) == len(replies)
    finally:
        model.close()


def test_a_permission_prompt_is_asked_in_linear_and_the_persons_pick_decides(
    api: Api, linear: Linear, running: Any, repo: Path
) -> None:
    """A command the permission mode does not allow: a select elicitation in Linear; Allow lets it
    run, Deny does not, and the model's next request carries the outcome."""

    def script(request: dict[str, Any]) -> list[Block]:
        case = "allow" if "[allow]" in texts(request) else "deny"
        if turns(request) == 0:
            command = f"touch made-by-{case}.txt && echo written"
            return [Text("Writing the notes."), ToolUse("Bash", {"command": command, "description": "Write"})]
        return [Text(f"Outcome: {last_user_text(request)}")]

    model = ScriptedModel(script)
    try:
        running(model)
        allow_and_deny(
            api,
            linear,
            lambda case: repo / f"made-by-{case}.txt",
            lambda case: [f"touch made-by-{case}.txt && echo written", "Bash"],
        )
        outcome = {
            case: last_user_text(
                next(r for r in model.agent_requests if f"[{case}]" in texts(r) and turns(r))
            )
            for case in ("allow", "deny")
        }
        assert outcome["allow"] == "written"
        assert outcome["deny"] == "Denied by the person in Linear."
        assert first_action(linear, "as-deny")["result"] == "Error: Denied by the person in Linear."
    finally:
        model.close()


def test_a_permission_nobody_answers_is_denied_after_the_approval_timeout_and_linear_told(
    api: Api, linear: Linear, running: Any, repo: Path
) -> None:
    def script(request: dict[str, Any]) -> list[Block]:
        if turns(request) == 0:
            return [ToolUse("Bash", {"command": "touch unanswered.txt", "description": "Write"})]
        return [Text(f"Outcome: {last_user_text(request)}")]

    model = ScriptedModel(script)
    try:
        running(model, "--approval-timeout", "2")
        assert unanswered(api, linear) == "Error: No answer in Linear within 2 seconds: not allowed."
        assert last_user_text(model.agent_requests[1]) == "No answer in Linear within 2 seconds: not allowed."
        assert not (repo / "unanswered.txt").exists()
    finally:
        model.close()


def test_a_follow_up_reaches_the_running_cli_and_later_commands_resume_its_session(
    api: Api, linear: Linear, running: Any, repo: Path, tmp_path: Path
) -> None:
    """A follow-up written while the CLI works reaches it in the same process (its next request
    carries the text); after it exits, and after the orchestrator is SIGKILLed mid-run, the next
    COMMAND resumes the CLI's session (the model sees the earlier turns); a stop ends it within
    the grace and the conversation still resumes."""

    def script(request: dict[str, Any]) -> list[Block]:
        last = last_user_text(request)
        if "[work]" in last:
            return [Text("Working on it."), ToolUse("Bash", {"command": "sleep 4", "description": "Work"})]
        if "[long]" in last:
            return [Text("A long one."), ToolUse("Bash", {"command": "sleep 20", "description": "Work"})]
        return [Text(f"Answered turn {turns(request)}.")]

    model = ScriptedModel(script)

    def follow_up(text: str) -> dict[str, Any]:
        """Said in Linear: the model's request that carries it, once the CLI sent it."""
        api.webhook(agent_session_event(session_id="as-resume", action="prompted", body=text))
        wait_for(lambda: any(text in last_user_text(r) for r in model.agent_requests), 60, repr(text))
        return next(r for r in model.agent_requests if text in last_user_text(r))

    try:
        o = running(model, SLEEPS)
        # 1. a follow-up while the CLI works: the same process takes it
        api.webhook(agent_session_event(session_id="as-resume", body="Remember ZEBRA [work]"))
        wait_for(lambda: len(model.agent_requests) == 1, timeout=60, what="the CLI's first request")
        api.webhook(
            agent_session_event(session_id="as-resume", action="prompted", body="Also the EMPTY CART")
        )
        wait_for(lambda: last_word(linear, "as-resume") is not None, timeout=60, what="the first answer")
        second = model.agent_requests[1]
        assert "Also the EMPTY CART" in texts(second) and "Remember ZEBRA" in texts(second)
        assert o.log().count("started ENG-7") == 1  # one COMMAND took both
        session = json.loads((o.state / "conversations" / "as-resume" / "agent-claude.json").read_text())
        assert session["sessionId"]
        assert not list((o.state / "conversations" / "as-resume" / "inbox").glob("*.json"))  # taken in

        # 2. after it exited: the next COMMAND resumes the session
        api.webhook(agent_session_event(session_id="as-resume", action="prompted", body="What came first?"))
        wait_for(lambda: o.log().count("started ENG-7") == 2, timeout=30, what="the next COMMAND")
        wait_for(lambda: len(model.agent_requests) == 3, timeout=60, what="its request")
        resumed = model.agent_requests[2]
        assert "Remember ZEBRA" in texts(resumed) and "Also the EMPTY CART" in texts(resumed)
        assert resumed["messages"][0] == second["messages"][0]  # the same conversation, resumed

        # 3. the orchestrator SIGKILLed while the CLI works; restarted; the next COMMAND resumes
        api.webhook(agent_session_event(session_id="as-resume", action="prompted", body="Then more [work]"))
        wait_for(lambda: o.log().count("started ENG-7") == 3, timeout=30, what="the third COMMAND")
        wait_for(
            lambda: any("[work]" in last_user_text(r) for r in model.agent_requests[3:]), 60, "it working"
        )
        o.signal(signal.SIGKILL)
        assert o.proc is not None and o.proc.wait(timeout=10) == -signal.SIGKILL
        o.start()
        wait_for(lambda: answers(linear, "as-resume") == 3, timeout=60, what="the CLI finishing alone")
        assert len(model.agent_requests) == 5  # (its tool's result went to the model, then it answered)
        banana = follow_up("And BANANA?")
        assert "Remember ZEBRA" in texts(banana) and "Then more [work]" in texts(banana)

        assert o.log().count("started ENG-7") == 4  # a COMMAND of its own, after the restart

        # 4. Linear's stop while a long command runs: ended within the grace, resumable later
        wait_for(lambda: answers(linear, "as-resume") == 4, timeout=60, what="the answer")
        api.webhook(agent_session_event(session_id="as-resume", action="prompted", body="Now the [long] job"))
        wait_for(lambda: any("[long]" in last_user_text(r) for r in model.agent_requests), 60, "the long job")
        wait_for(lambda: claude_running("as-resume"), timeout=30, what="the CLI running")
        api.webhook(agent_session_event(session_id="as-resume", action="prompted", signal="stop"))
        wait_for(lambda: "stopped agent session as-resume" in o.log(), timeout=30, what="the stop")
        assert not claude_running("as-resume")
        # It ended by itself within the grace (interrupted, stdin closed), not SIGKILLed after it.
        assert o.log().rsplit("finished with exit code", 1)[1].split()[0] == "0"
        wait_for(
            lambda: (
                ("response", "Stopped, as asked in Linear.")
                in [(a["content"]["type"], a["content"].get("body")) for a in said(linear, "as-resume")]
            ),
            30,
            "the stop's response",
        )
        after = follow_up("Where were we?")
        assert "Now the [long] job" in texts(after) and "sleep 20" in texts(after)

        # 5. a session the CLI no longer has (its history pruned): a new one, pointed at the transcript
        wait_for(lambda: answers(linear, "as-resume") == 6, timeout=60, what="the answer after the stop")
        for kept in (tmp_path / "home" / ".claude" / "projects").rglob("*.jsonl"):
            kept.unlink()
        fresh = follow_up("Start over?")
        wait_for(lambda: answers(linear, "as-resume") == 7, timeout=60, what="the new session's answer")
        assert "Remember ZEBRA" not in texts(fresh)
        assert "This continues a conversation from Linear" in last_user_text(fresh)
        assert str(o.state / "conversations" / "as-resume" / "transcript.jsonl") in last_user_text(fresh)
        assert kinds(linear, "as-resume").count("error") == 0
    finally:
        model.close()


def claude_pids(agent_session: str) -> list[int]:
    return agent_pids(agent_session, "claude")


def claude_running(agent_session: str) -> bool:
    return bool(claude_pids(agent_session))


def test_a_cli_missing_a_refused_key_and_a_crash_are_errors_that_name_the_cause(
    api: Api, linear: Linear, running: Any, repo: Path
) -> None:
    model = ScriptedModel(lambda r: [Text("Working."), ToolUse("Bash", {"command": "sleep 20"})])
    try:
        o = running(model, SLEEPS)
        # a crash: the CLI killed mid-run
        begin(api, "as-crash")
        wait_for(lambda: claude_running("as-crash"), timeout=60, what="the CLI")
        wait_for(lambda: len(model.agent_requests) >= 1, timeout=60, what="its request")
        [pid] = claude_pids("as-crash")
        os.kill(pid, signal.SIGKILL)
        assert the_error(linear, "as-crash").startswith(
            "Claude Code was killed by signal 9 before it finished."
        )
        # the model's API refusing the key (401): said at once, not after the CLI's ten retries
        model.key = "sk-ant-another-key"
        begin(api, "as-401")
        refused = the_error(linear, "as-401")  # (said once, however often the CLI retried)
        assert "refused Claude Code's credentials (HTTP 401" in refused
        assert "--pass-env ANTHROPIC_API_KEY" in refused
        wait_for(lambda: not claude_running("as-401"), timeout=30, what="the CLI ended")
        o.stop()
        # the CLI not installed: not on the PATH the orchestrator gives its agent
        running(model, path="/usr/bin:/bin")
        begin(api, "as-missing")
        missing = the_error(linear, "as-missing")
        assert "Claude Code is not installed on this machine: `claude` is not on the PATH" in missing
        assert "npm install -g @anthropic-ai/claude-code@2.1.332" in missing
    finally:
        model.close()


def test_the_agent_never_gets_the_token_that_speaks_in_linear(
    api: Api, linear: Linear, running: Any, repo: Path
) -> None:
    model = ScriptedModel(lambda r: [ToolUse("Bash", {"command": "env"})] if not turns(r) else [Text("ok")])
    try:
        running(model, "--agent-arg=--allowedTools=Bash(env)")
        api.webhook(agent_session_event(session_id="as-env", body="env"))
        wait_for(lambda: last_word(linear, "as-env") is not None, timeout=60, what="the answer")
        [action] = [a["content"] for a in said(linear, "as-env") if a["content"]["type"] == "action"]
        seen = texts(model.agent_requests[1])
        assert "DEVPILOT_AGENT_SESSION_ID=as-env" in seen  # (the command's whole output reached the model)
        assert "DEVPILOT_AGENT_TOKEN" not in seen and "dpa." not in seen
        assert action["action"] == "Bash" and action["parameter"] == "env"
    finally:
        model.close()
