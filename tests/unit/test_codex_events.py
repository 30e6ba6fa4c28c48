"""Codex's app-server, as the pinned CLI really speaks it (tests/fixtures/codex/, recorded by
tests/helpers/record_codex.py), mapped to what Linear shows: the runner's mapping and narrator, with
a speaker that records what would be posted."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest

from orchestrator.runners.codex import NATIVE, native
from orchestrator.runners.codex_events import (
    QUESTION,
    Approval,
    CodexEvents,
    Effect,
    Retrying,
    TurnEnded,
    TurnStarted,
    command_text,
    diff_size,
)
from orchestrator.runners.narrator import Narrator
from tests.helpers.heard import Heard

FIXTURES = Path(__file__).parent.parent / "fixtures" / "codex"
WORK = Path("/work/cart")  # (where the recordings ran, as record_codex.py rewrites it)


def replay(name: str, declined: dict[str, str] | None = None) -> tuple[Heard, list[Effect], CodexEvents]:
    """The fixture through the mapping, its turns ended as the runner ends them; `declined`: why
    the runner declined which item."""
    heard = Heard()
    events = CodexEvents(Narrator(heard), WORK, declined=dict(declined or {}))
    effects: list[Effect] = []
    for line in (FIXTURES / f"{name}.jsonl").read_text().splitlines():
        for effect in events.feed(json.loads(line)):
            effects.append(effect)
            if isinstance(effect, TurnEnded) and effect.status == "completed":
                events.narrator.flush()
                events.narrator.finish(events.answer())
            elif isinstance(effect, TurnEnded) and effect.status == "failed":
                events.narrator.fail(effect.error)
    return heard, effects, events


def test_messages_and_reasoning_are_merged_thoughts_commands_and_patches_actions_the_last_message_the_response() -> (
    None
):
    heard, effects, _ = replay("tools")
    plan = [
        {"content": "Read the cart", "status": "inProgress"},
        {"content": "Fix the total", "status": "pending"},
    ]
    done = [
        {"content": "Read the cart", "status": "completed"},
        {"content": "Fix the total", "status": "completed"},
    ]
    assert heard.shown() == [
        ("thought", "Reading the cart first.\n\nI'll plan, then look."),  # reasoning and message: one thought
        ("plan", json.dumps(plan)),  # (posted when the agent goes on to work)
        ("action", "Run", "ls", "README\ncart.py"),  # (the command as written, not bash -c '…')
        (
            "action",
            "Run",
            "cat missing.txt",
            "Error: exit code 1\ncat: missing.txt: No such file or directory",
        ),
        ("thought", "The total is wrong."),
        ("action", "Edit", "cart.py", "cart.py +1 -1"),
        ("plan", json.dumps(done)),
        ("response", "The cart's total now sums its items."),
    ]
    assert [type(e) for e in effects] == [TurnStarted, TurnEnded]
    assert all(not p.get("ephemeral") for p in heard.posts)


def test_approvals_are_asked_held_and_a_declined_call_shows_why_as_its_result() -> None:
    heard, effects, events = replay(
        "approvals",
        {"call_4": "Denied by the person in Linear.", "call_6": "No answer in Linear: not allowed."},
    )
    asked = [e for e in effects if isinstance(e, Approval)]
    assert [(a.method, a.item_id, a.what, a.reason) for a in asked] == [
        (
            "item/commandExecution/requestApproval",
            "call_2",
            "touch /outside/allowed.txt && echo written",
            "Write outside the checkout",
        ),
        (
            "item/commandExecution/requestApproval",
            "call_4",
            "touch /outside/denied.txt",
            "Write outside the checkout",
        ),
        ("item/fileChange/requestApproval", "call_6", "/outside/notes.md", ""),  # (its paths: from the item)
    ]
    assert [a.request_id for a in asked] == [0, 1, 2]
    assert heard.shown() == [
        ("action", "Run", "touch /outside/allowed.txt && echo written", "written"),
        ("action", "Run", "touch /outside/denied.txt", "Error: Denied by the person in Linear."),
        ("action", "Create", "/outside/notes.md", "Error: No answer in Linear: not allowed."),
        ("response", "One allowed, two declined."),
    ]
    assert not events.declined  # (each reason used once)


def test_an_asked_call_is_not_shown_running_while_the_person_decides() -> None:
    heard = Heard()
    events = CodexEvents(Narrator(heard), WORK)
    lines = (FIXTURES / "approvals.jsonl").read_text().splitlines()
    for line in lines:
        message = json.loads(line)
        events.feed(message)
        if message.get("method") == "item/commandExecution/requestApproval":
            break
    assert events.narrator.running["call_2"].held


def test_a_steered_follow_up_folds_into_the_running_turn() -> None:
    heard, effects, _ = replay("steer")
    assert heard.shown() == [("thought", "Working on the cart."), ("response", "Covered the empty cart too.")]
    assert len([e for e in effects if isinstance(e, TurnEnded)]) == 1  # one turn


def test_an_interrupted_turn_ends_interrupted_its_cut_command_said_so() -> None:
    heard, effects, _ = replay("interrupt")
    [ended] = [e for e in effects if isinstance(e, TurnEnded)]
    assert ended.status == "interrupted"
    assert heard.shown() == [("thought", "A long one."), ("action", "Run", "sleep 30", "(interrupted)")]


def test_a_command_still_running_when_the_turn_ends_is_closed() -> None:
    heard, _, _ = replay("background")
    assert heard.shown() == [
        ("action", "Run", "sleep 3; echo late", "(still running when the turn ended)"),
        ("response", "Left it running."),
    ]


def test_a_question_to_the_person_carries_its_options() -> None:
    heard, effects, _ = replay("question")
    [asked] = [e for e in effects if isinstance(e, Approval)]
    assert asked.method == QUESTION
    assert [q["question"] for q in asked.questions] == ["Which database should the tests use?"]
    assert [o["label"] for o in asked.questions[0]["options"]] == ["Postgres", "SQLite"]
    assert heard.shown() == [("response", "Using Postgres.")]


def test_a_refused_key_fails_the_turn_with_the_http_status() -> None:
    heard, effects, _ = replay("refused")
    [ended] = [e for e in effects if isinstance(e, TurnEnded)]
    assert (ended.status, ended.http_status) == ("failed", 401)
    assert ended.error.startswith("unexpected status 401 Unauthorized: Incorrect API key provided")
    assert not [e for e in effects if isinstance(e, Retrying)]
    assert heard.shown() == [("error", ended.error)]


def test_a_broken_stream_fails_the_turn_and_what_was_said_is_a_thought() -> None:
    heard, effects, _ = replay("dropped")
    [ended] = [e for e in effects if isinstance(e, TurnEnded)]
    assert ended.status == "failed" and "stream disconnected before completion" in ended.error
    assert heard.shown() == [("thought", "Half a"), ("error", ended.error)]


def test_an_unreachable_api_is_retried_and_the_runner_knows_since_when() -> None:
    heard = Heard()
    events = CodexEvents(Narrator(heard), WORK)
    retried: list[Effect] = []
    since = []
    for line in (FIXTURES / "unreachable.jsonl").read_text().splitlines():
        found = events.feed(json.loads(line))
        retried += [e for e in found if isinstance(e, Retrying)]
        since.append(events.retrying_since)
    assert (
        retried
        == [Retrying("Reconnecting... waiting for network (Connection failed: error sending request)", None)]
        * 2
    )
    first = next(s for s in since if s is not None)
    assert since[-2] == first  # (the second retry does not reset it)
    assert since[-1] is None  # the turn ended: nothing is retried any more
    assert heard.shown() == []


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("/bin/bash -c ls", "ls"),
        ("/bin/bash -lc 'git status && ls -a'", "git status && ls -a"),
        ("/bin/zsh -lc \"echo 'x'\"", "echo 'x'"),
        ("python3 -m pytest", "python3 -m pytest"),
        ("/bin/bash -c 'unbalanced", "/bin/bash -c 'unbalanced"),
    ],
)
def test_a_command_is_shown_as_the_agent_wrote_it(command: str, shown: str) -> None:
    assert command_text(command) == shown


def test_a_changes_size() -> None:
    assert (
        diff_size("@@ -1,2 +1,2 @@\n def total(items):\n-    return 0\n+    return sum(items)\n") == "+1 -1"
    )
    assert diff_size("x = 1\ny = 2\n") == "+2"  # (a new file's diff is its content)


def test_the_runner_starts_the_native_binary_of_the_npm_package_not_its_node_launcher(tmp_path: Path) -> None:
    found = NATIVE.get((platform.system(), platform.machine()))
    if found is None:
        pytest.skip(f"no native codex package for {platform.system()} {platform.machine()}")
    package, triple = found
    openai = tmp_path / "lib" / "node_modules" / "@openai"
    launcher = openai / "codex" / "bin" / "codex.js"
    launcher.parent.mkdir(parents=True)
    launcher.write_text("#!/usr/bin/env node\n")
    on_path = tmp_path / "bin" / "codex"
    on_path.parent.mkdir()
    on_path.symlink_to(launcher)
    assert native(str(on_path)) == (str(on_path), {})  # no binary beside it: the launcher, as it is
    for vendor in (
        openai / "codex" / "node_modules" / "@openai" / package,
        openai / package,
    ):  # nested, hoisted
        binary = vendor / "vendor" / triple / "bin" / "codex"
        binary.parent.mkdir(parents=True)
        binary.write_text("")
        binary.chmod(0o755)
        started, env = native(str(on_path))
        assert started == str(binary)
        assert env == {"CODEX_MANAGED_BY_NPM": "1", "CODEX_MANAGED_PACKAGE_ROOT": str(openai / "codex")}
        os.remove(binary)
    plain = tmp_path / "plain" / "codex"  # a codex that is no npm launcher (a native install)
    plain.parent.mkdir()
    plain.write_text("")
    assert native(str(plain)) == (str(plain), {})
