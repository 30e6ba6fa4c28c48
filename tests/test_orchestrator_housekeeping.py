"""`--keep-days`: the state directory stays bounded, as real processes show it. A restarted
orchestrator removes what finished over N days ago (files set back in time with os.utime, journal
rows with their `updated_at`): an old conversation's folder, worktree and each of its messages'
files; it keeps a recent conversation, one with a message the journal calls unfinished, and a
worktree with uncommitted work; a redelivery of a kept message is still never written twice;
`--keep-days 0` removes nothing, and a negative value is refused."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.conversations import Conversations, conversation_key
from orchestrator.journal import Journal
from tests.helpers.api import Api, agent_session_event
from tests.helpers.linear import Linear
from tests.test_machine_conversations import follow_up_claimed, machine, started_with, starts
from tests.test_orchestrator import SHORT_LEASE, Orch, wait_for
from tests.test_orchestrator_conversations import alive

BACK = 3 * 86_400  # seconds things are set back: older than --keep-days 1


def journal_rows(o: Orch, session: str) -> list[tuple[str, str]]:
    """(message id, state) of the agent session's messages in the machine's journal."""
    with contextlib.closing(sqlite3.connect(o.state / "journal.sqlite3")) as db:
        rows = db.execute(
            "SELECT message_id, state FROM journal WHERE json_extract(message, '$.agentSessionId') = ?"
            " ORDER BY updated_at",
            (session,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def message_files(o: Orch, mid: str) -> list[Path]:
    """The message's files in the state dir (those that exist)."""
    paths = [o.state / d / mid for d in ("inboxed", "started", "responded")]
    return [p for p in [*paths, o.state / "logs" / f"{mid}.stderr"] if p.exists()]


def set_back(o: Orch, session: str) -> list[Path]:
    """Everything of the conversation, as if its last change were three days ago: its folder, its
    messages' files and journal rows. Returns those files."""
    then = time.time() - BACK
    folder = o.state / "conversations" / session
    mids = [mid for mid, _ in journal_rows(o, session)]
    files = [f for mid in mids for f in message_files(o, mid)]
    for path in [*folder.rglob("*"), folder, *files]:
        os.utime(path, (then, then), follow_symlinks=False)
    with contextlib.closing(sqlite3.connect(o.state / "journal.sqlite3")) as db:
        db.executemany(
            "UPDATE journal SET updated_at = updated_at - ? WHERE message_id = ?", [(BACK, m) for m in mids]
        )
        db.commit()
    return files


def test_old_finished_conversations_go_and_recent_or_unfinished_ones_stay(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    o = machine(api, tmp_path, "--keep-days", "1")
    o.start()
    sessions = ("as-old", "as-new", "as-pending")
    for sid in sessions:
        api.webhook(agent_session_event(session_id=sid, issue_id=f"iss-{sid}", body="please [talk]"))
    for sid in sessions:
        wait_for(lambda sid=sid: ("response", "Finished.") in linear.said(sid), what=f"{sid} finished")
    assert o.stop() == 0
    # as-pending: a follow-up taken and journaled, and the machine stopped before its inbox write.
    api.webhook(agent_session_event(session_id="as-pending", action="prompted", body="go on"))
    [follow_up] = api.post_as(o.token, "/claim").json()["messages"]
    journal = Journal(o.state / "journal.sqlite3")
    journal.record(follow_up)
    journal.close()
    old_files = set_back(o, "as-old")
    set_back(o, "as-pending")  # old too, but its follow-up is unfinished
    new_files = [f for mid, _ in journal_rows(o, "as-new") for f in message_files(o, mid)]
    assert len(old_files) == len(new_files) == 4  # inboxed/, started/, responded/, logs/

    o.start()
    wait_for(lambda: "housekeeping: removed" in o.log(), what="the housekeeping")
    conversations = o.state / "conversations"
    assert sorted(p.name for p in conversations.iterdir()) == ["as-new", "as-pending"]
    assert [f for f in old_files if f.exists()] == [] and journal_rows(o, "as-old") == []
    assert (conversations / "as-new" / "transcript.jsonl").exists() and all(f.exists() for f in new_files)
    assert len(journal_rows(o, "as-new")) == 1
    assert len(journal_rows(o, "as-pending")) == 2  # its start's row too: its transcript is made of them
    assert "removed 1 conversation(s)" in o.log()
    # ... whose follow-up is then handed over and started, with the conversation's whole thread.
    wait_for(lambda: len(starts(o)) == 4, what="the follow-up started after the restart")
    resumed = starts(o)[-1]
    assert resumed["messageId"] == follow_up["messageId"]
    assert [e["kind"] for e in resumed["transcript"] if e["from"] == "user"] == ["start", "prompt"]
    assert o.stop() == 0


def test_a_conversation_whose_command_runs_keeps_everything_and_its_stop_still_finds_it(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    """A COMMAND that has run for three days, started before the orchestrator was SIGKILLed: the
    restarted orchestrator (found by its marker) removes nothing of its conversation, so Linear's
    stop still finds and ends it."""
    o = machine(api, tmp_path, "--keep-days", "1")
    o.start()
    api.webhook(agent_session_event(session_id="as-long", body="please [sleep]"))
    wait_for(lambda: len(starts(o)) == 1, what="the agent running")
    pid = starts(o)[0]["pid"]
    o.signal(signal.SIGKILL)
    assert o.proc is not None
    o.proc.wait()
    files = set_back(o, "as-long")
    assert len(files) == 3  # inboxed/, started/, logs/ (it said nothing yet)
    o.start()
    wait_for(lambda: o.log().count("told the service") == 2, what="the restart past its start-up")
    assert all(f.exists() for f in files) and (o.state / "conversations" / "as-long").is_dir()
    assert len(journal_rows(o, "as-long")) == 1 and "housekeeping" not in o.log()
    api.webhook(agent_session_event(session_id="as-long", action="prompted", signal="stop"))
    wait_for(lambda: ("response", "Stopped, as asked in Linear.") in linear.said("as-long"), what="stopped")
    wait_for(lambda: not alive(pid), timeout=10, what="the agent ended")
    assert o.stop() == 0


@pytest.mark.parametrize("api_overrides", [SHORT_LEASE])
def test_a_redelivered_message_of_a_kept_conversation_is_never_written_twice(
    api: Api, tmp_path: Path
) -> None:
    """A follow-up written into the inbox and read by the agent, its ack lost with the machine
    (`inboxed` in the journal), and its claim lapsed and taken again since: three days later, the
    restarted machine with --keep-days 1 keeps it (unfinished), and when the service delivers the
    same message again it is acked, neither written into the inbox again nor started."""
    o = machine(api, tmp_path, "--keep-days", "1")
    token = o.token
    m = follow_up_claimed(api, o, "as-again")
    journal = Journal(o.state / "journal.sqlite3")
    journal.record(m)
    conversations = Conversations(o.state)
    conv = conversations.of(conversation_key(m))
    conversations.put(conv, m)
    journal.mark(m["messageId"], "inboxed")  # then the crash, before the ack
    journal.close()
    for path in conv.inbox.iterdir():
        path.unlink()  # the running agent read it
    time.sleep(1.2)  # its 1 s lease ends; the sweep puts it back, and a claim takes it again
    api.http.post("/sweep", headers=api.admin())

    def claimed_again() -> bool:
        return bool(api.post_as(token, "/claim").json()["messages"])

    wait_for(claimed_again, timeout=10, what="a second claim of the follow-up")
    [link] = message_files(o, m["messageId"])
    set_back(o, "as-again")

    stop = threading.Event()

    def sweeper() -> None:  # the second claim's lease ends too: the service delivers it once more
        while not stop.is_set():
            api.http.post("/sweep", headers=api.admin())
            time.sleep(0.3)

    def delivered() -> bool:
        with api.pool.connection() as c:
            row = c.execute(
                "SELECT status FROM dispatch_sessions WHERE message_id = %s", (m["messageId"],)
            ).fetchone()
        return row is not None and row["status"] == "delivered"

    sweeping = threading.Thread(target=sweeper, daemon=True)
    sweeping.start()
    try:
        o.start()
        wait_for(delivered, what="the third delivery acked")
    finally:
        stop.set()
        sweeping.join()
    time.sleep(1.0)
    assert starts(o) == [] and list(conv.inbox.glob("*")) == []  # never handed over again
    assert "claimed ENG-7 (attempt 3)" in o.log() and "already handed over here; acked again" in o.log()
    assert journal_rows(o, "as-again") == [(m["messageId"], "delivered")]
    assert link.exists() and conv.folder.exists() and "housekeeping" not in o.log()  # all kept
    assert o.stop() == 0


def test_keep_days_0_removes_nothing_and_a_negative_value_is_refused(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    o = machine(api, tmp_path, "--keep-days", "0")
    o.start()
    api.webhook(agent_session_event(session_id="as-kept", issue_id="iss-kept", body="please [talk]"))
    wait_for(lambda: ("response", "Finished.") in linear.said("as-kept"), what="the first conversation")
    assert o.stop() == 0
    files = set_back(o, "as-kept")
    before = sorted((o.state / "conversations" / "as-kept").rglob("*"))
    o.start()
    api.webhook(agent_session_event(session_id="as-later", issue_id="iss-later", body="please [talk]"))
    wait_for(lambda: ("response", "Finished.") in linear.said("as-later"), what="a run past its start-up")
    assert o.stop() == 0
    assert "housekeeping" not in o.log()
    assert sorted((o.state / "conversations" / "as-kept").rglob("*")) == before and before
    assert all(f.exists() for f in files) and len(journal_rows(o, "as-kept")) == 1

    r = started_with(api, "--keep-days", "-1")
    assert r.returncode == 2 and "--keep-days must be 1 or more (days), or 0" in r.stderr, r.stderr


def test_an_old_conversations_worktree_goes_with_it_unless_work_in_it_is_uncommitted(
    api: Api, linear: Linear, tmp_path: Path, repo: Path
) -> None:
    """Two conversations that asked a question and were never answered keep their worktrees; three
    days later the clean one goes with its folder (its branch, with the agent's commit, stays), the
    one with uncommitted work stays with its folder, and the log says why."""
    o = machine(api, tmp_path, "--worktree", "--pass-env", "PYTHONPATH", "--keep-days", "1", cwd=repo)
    o.start()
    for sid in ("as-wt-clean", "as-wt-dirty"):
        api.webhook(agent_session_event(session_id=sid, issue_id=f"iss-{sid}", body="please [ask]"))
    for sid in ("as-wt-clean", "as-wt-dirty"):
        wait_for(lambda sid=sid: ("elicitation", "Which database?") in linear.said(sid), what=f"{sid} asks")
    wait_for(lambda: len(starts(o)) == 2, what="both started")
    time.sleep(0.5)  # (each COMMAND's exit handled)
    assert o.stop() == 0
    where = {s["env"]["DEVPILOT_AGENT_SESSION_ID"]: Path(s["cwd"]) for s in starts(o)}
    assert all(p.is_dir() for p in where.values())
    (where["as-wt-dirty"] / "notes.txt").write_text("the agent's unfinished work\n")
    subprocess.run(
        ["git", "commit", "-q", "--allow-empty", "-m", "done"], cwd=where["as-wt-clean"], check=True
    )
    for sid in where:
        set_back(o, sid)

    o.start()
    wait_for(lambda: "housekeeping: removed" in o.log(), what="the housekeeping")
    assert [p.name for p in (o.state / "conversations").iterdir()] == ["as-wt-dirty"]
    assert not where["as-wt-clean"].exists()
    assert (where["as-wt-dirty"] / "notes.txt").exists()
    assert "kept the worktree of as-wt-dirty" in o.log() and "changes nobody committed" in o.log()
    assert "removed 1 conversation(s)" in o.log()
    branches = subprocess.run(
        ["git", "branch", "--list", "devpilot/*"], cwd=repo, capture_output=True, text=True
    )
    assert "devpilot/eng-7-as-wt-clean" in branches.stdout  # what the agent committed outlives its worktree
    assert o.stop() == 0
