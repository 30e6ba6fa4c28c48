"""Claude Code's stream, as the pinned CLI really writes it (tests/fixtures/claude/, recorded by
tests/helpers/record_claude.py), mapped to what Linear shows: the runner's mapping and narrator,
with a speaker that records what would be posted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runners import narrator as narration
from orchestrator.runners.claude_stream import (
    ClaudeStream,
    Effect,
    Init,
    Permission,
    Result,
    TurnEnded,
    parameter,
)
from orchestrator.runners.narrator import Narrator, first_lines
from tests.helpers.heard import Heard

FIXTURES = Path(__file__).parent.parent / "fixtures" / "claude"
WORK = Path("/work/cart")  # (where the recordings ran, as record_claude.py rewrites it)


def replay(name: str) -> tuple[Heard, list[Effect], ClaudeStream]:
    heard = Heard()
    stream = ClaudeStream(Narrator(heard), WORK)
    effects: list[Effect] = []
    for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
        for effect in stream.feed(json.loads(line)):
            effects.append(effect)
            if isinstance(effect, Result):  # (as the runner ends a run)
                if effect.is_error:
                    stream.narrator.fail(effect.reason)
                else:
                    stream.narrator.finish(effect.text)
    return heard, effects, stream


def test_texts_are_merged_thoughts_tool_calls_actions_with_their_results_and_the_last_text_the_response() -> (
    None
):
    heard, effects, stream = replay("tools")
    assert heard.shown() == [
        ("thought", "Let me look at the code."),
        ("action", "Bash", "ls", "cart.py"),
        ("action", "Read", "cart.py", "1\tdef total(items):\n2\t    return 0\n3"),
        (
            "action",
            "Grep",
            "def total in /work/cart",
            "Error: Error: No such tool available: Grep. Grep is not available in this session — search file "
            "contents with `grep` via the Bash tool instead.",
        ),
        ("thought", "Found it.\n\nFixing the total."),  # two texts in a row: one thought
        (
            "action",
            "Edit",
            "cart.py",
            "The file /work/cart/cart.py has been updated successfully. (file state is current in your "
            "context — no need to Read it back)",
        ),
        ("response", "The cart total now sums its items."),
    ]
    assert stream.session_id is not None and Init(stream.session_id) in effects
    [edit] = [e for e in effects if isinstance(e, Permission)]
    assert (edit.tool, edit.input["file_path"], edit.tool_use_id) == (
        "Edit",
        "/work/cart/cart.py",
        edit.tool_use_id,
    )
    assert all(not p.get("ephemeral") for p in heard.posts)


def test_the_task_tools_are_the_plan_not_actions() -> None:
    heard, _, stream = replay("plan")
    shown = heard.shown()
    # ToolSearch, TaskCreate, TaskUpdate: plumbing, not actions
    assert [s[:3] for s in shown if s[0] == "action"] == [("action", "Bash", "ls")]
    plans = [json.loads(s[1]) for s in shown if s[0] == "plan"]
    assert plans[-1] == [
        {"content": "Read the cart", "status": "completed"},
        {"content": "Fix the cart total", "status": "inProgress"},
    ]  # the deleted task is gone, the renamed one renamed
    # Posted when the agent goes on to work, once per change it made in one go (7 calls, 2 posts).
    assert plans[0] == [
        {"content": "Read the cart", "status": "inProgress"},
        {"content": "Fix the total", "status": "pending"},
        {"content": "Drop the cache", "status": "pending"},
    ]
    assert len(plans) == 2
    assert shown.index(("plan", json.dumps(plans[0]))) < [s[0] for s in shown].index("action")
    assert stream.tasks["2"] == {"subject": "Fix the cart total", "status": "in_progress"}
    assert shown[-1] == ("response", "Planned and started.")


def test_todowrite_is_the_plan_where_the_cli_offers_it() -> None:
    heard, _, _ = replay("todowrite")
    assert heard.shown() == [
        (
            "plan",
            json.dumps(
                [
                    {"content": "Read the cart", "status": "completed"},
                    {"content": "Fix the total", "status": "inProgress"},
                ]
            ),
        ),
        ("response", "Listed."),
    ]


def test_a_denied_permission_is_the_actions_result() -> None:
    heard, effects, _ = replay("permission-denied")
    [asked] = [e for e in effects if isinstance(e, Permission)]
    assert (asked.tool, asked.input["command"], asked.description) == (
        "Bash",
        "touch notes.txt",
        "Create notes",
    )
    assert heard.shown() == [
        ("thought", "Creating the file."),
        ("action", "Bash", "touch notes.txt", "Error: Denied by the person in Linear."),
        ("response", "I could not create it: it was denied."),
    ]


def test_a_question_to_the_person_is_a_permission_request_with_its_questions_and_no_action() -> None:
    heard, effects, _ = replay("question")
    [asked] = [e for e in effects if isinstance(e, Permission)]
    assert asked.tool == "AskUserQuestion"
    assert [q["question"] for q in asked.questions] == ["Which database should the cart use?"]
    assert [o["label"] for o in asked.questions[0]["options"]] == ["Postgres", "SQLite"]
    assert heard.shown() == [("response", "Going with SQLite.")]


def test_an_interrupted_turn_ends_in_an_error_result_and_its_turn_cancelled() -> None:
    from tests.helpers.record_claude import TURN

    _, effects, _ = replay("interrupt")
    [result] = [e for e in effects if isinstance(e, Result)]
    assert result.is_error and result.subtype == "error_during_execution"
    assert TurnEnded(TURN) in effects  # (cancelled: the runner waits for no more of it)


def test_a_follow_up_mid_turn_is_reported_done_by_its_uuid() -> None:
    from tests.helpers.record_claude import FOLLOW_UP, TURN

    _, effects, _ = replay("follow-up")
    ended = [e.uuid for e in effects if isinstance(e, TurnEnded)]
    assert sorted(ended) == sorted([TURN, FOLLOW_UP])
    assert len([e for e in effects if isinstance(e, Result)]) == 1  # folded into the running turn


def test_no_credentials_is_an_error_result_and_the_made_up_message_is_not_a_thought() -> None:
    heard, effects, _ = replay("not-logged-in")
    [result] = [e for e in effects if isinstance(e, Result)]
    assert result.is_error and "Not logged in" in result.reason
    assert heard.shown() == [("error", "Not logged in · Please run /login")]  # said once, as the error


def test_a_session_that_cannot_be_resumed_fails_before_it_starts() -> None:
    _, effects, _ = replay("resume-missing")
    assert not [e for e in effects if isinstance(e, Init)]
    [result] = effects
    assert isinstance(result, Result) and result.is_error


@pytest.mark.parametrize(
    ("tool", "given", "shown"),
    [
        ("Bash", {"command": "pytest -q", "description": "Run"}, "pytest -q"),
        ("Read", {"file_path": "/work/cart/src/a.py"}, "src/a.py"),
        ("Write", {"file_path": "/elsewhere/a.py", "content": "x"}, "/elsewhere/a.py"),
        ("Glob", {"pattern": "**/*.py"}, "**/*.py"),
        ("WebFetch", {"url": "https://example.com", "prompt": "read"}, "https://example.com"),
        ("Agent", {"description": "Search the tests", "prompt": "..."}, "Search the tests"),
        ("mcp__linear__get_issue", {"id": "ENG-7"}, "ENG-7"),
    ],
)
def test_each_tool_shows_its_short_parameter(tool: str, given: dict[str, Any], shown: str) -> None:
    assert parameter(tool, given, WORK) == shown


def test_results_and_parameters_are_bounded() -> None:
    long = "\n".join(f"line {i}" for i in range(100))
    shown = first_lines(long)
    assert shown.splitlines()[: narration.RESULT_LINES] == [
        f"line {i}" for i in range(narration.RESULT_LINES)
    ]
    assert shown.endswith(f"({100 - narration.RESULT_LINES} more lines)")
    assert len(first_lines("x" * 10_000)) <= narration.RESULT_CHARS
    heard = Heard()
    n = Narrator(heard)
    n.action_started("t1", "Bash", "make test\nmake lint")
    n.action_finished("t1", "ok")
    assert heard.shown() == [("action", "Bash", "make test …", "ok")]


def test_a_long_tool_call_is_shown_running_once_and_ephemeral() -> None:
    heard = Heard()
    n = Narrator(heard)
    n.text("Running the suite.")
    n.action_started("t1", "Bash", "pytest")
    n.tick()
    assert heard.shown() == [("thought", "Running the suite.")]  # (not yet: it may end at once)
    n.running["t1"].since -= narration.RUNNING_AFTER
    n.tick()
    n.tick()
    assert heard.posts[-1] == {
        "content": {"type": "action", "action": "Bash", "parameter": "pytest"},
        "ephemeral": True,
    }
    assert len(heard.posts) == 2
    n.action_finished("t1", "3 passed")
    assert heard.shown()[-1] == ("action", "Bash", "pytest", "3 passed") and not heard.posts[-1].get(
        "ephemeral"
    )
    n.action_started("t2", "Bash", "rm -rf build")
    n.hold("t2")  # waiting for the person's approval: the elicitation says it, not a "running"
    n.running["t2"].since -= narration.RUNNING_AFTER
    n.tick()
    assert len(heard.posts) == 3
