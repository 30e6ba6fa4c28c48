"""A conversation on the machine, with real processes: the real orchestrator against the real
service, a real COMMAND (tests/helpers/agent_command.py) that records what it was given and what
it read. One COMMAND per agent session at a time; a follow-up reaches the running COMMAND's inbox;
the next COMMAND gets the whole transcript; SIGKILL between the inbox and the ack delivers once;
`--worktree` gives each conversation its own checkout; COMMAND's environment holds nothing the
person did not pass."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from orchestrator.environment import BASICS
from tests.helpers.api import Api, agent_session_event
from tests.helpers.linear import Linear
from tests.test_orchestrator import ROOT, Orch, wait_for

COMMAND = [sys.executable, str(ROOT / "tests/helpers/agent_command.py")]


def lines(o: Orch) -> list[dict[str, Any]]:
    if not o.started_file.exists():
        return []
    return [json.loads(x) for x in o.started_file.read_text().splitlines() if x.strip()]


def starts(o: Orch) -> list[dict[str, Any]]:
    return [x for x in lines(o) if "kind" in x]


def reads(o: Orch) -> list[dict[str, Any]]:
    return [x for x in lines(o) if "read" in x]


def machine(api: Api, tmp: Path, *extra: str, **kw: Any) -> Orch:
    _, token = api.register(user="user-1", name="laptop")
    return Orch(api.url, token, tmp, extra=["--stop-grace", "2", *extra], command=COMMAND, **kw)


HOLD_PROMPT_ACKS = """
CREATE FUNCTION test_hold_prompt_acks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'delivered' AND NEW.kind = 'prompt' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_hold_prompt_acks BEFORE UPDATE ON dispatch_sessions
    FOR EACH ROW EXECUTE FUNCTION test_hold_prompt_acks();
"""


def acks_waiting(db_url: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as watch:
        row = watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ).fetchone()
    return row is not None and row[0] > 0


def test_a_follow_up_reaches_the_running_agents_inbox_and_no_second_command_starts(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    o = machine(api, tmp_path)
    o.start()
    try:
        api.webhook(agent_session_event(session_id="as-live", body="please [listen:2]"))
        wait_for(lambda: len(starts(o)) == 1, what="the agent running")
        api.webhook(agent_session_event(session_id="as-live", action="prompted", body="use Postgres"))
        api.webhook(agent_session_event(session_id="as-live", action="prompted", body="that's all [done]"))
        # (the agent reads nothing before both are in its inbox: meanwhile, no second COMMAND)
        wait_for(lambda: ("response", "read 2 follow-up(s)") in linear.said("as-live"), what="its answer")
        [first] = starts(o)  # one COMMAND for the whole conversation
        assert [(r["pid"], r["body"]) for r in reads(o)] == [
            (first["pid"], "use Postgres"),
            (first["pid"], "that's all [done]"),
        ]  # the same process read both, in the order they were sent
        assert [r["file"] for r in reads(o)] == sorted(r["file"] for r in reads(o))  # ls order
        time.sleep(1.0)
        assert len(starts(o)) == 1  # nothing left unread: no second COMMAND
        assert "Finished." not in [b for _, b in linear.said("as-live")]  # its own answer was the last word
    finally:
        assert o.stop() == 0


def test_a_follow_up_after_the_agent_exited_starts_one_with_the_whole_transcript(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    o = machine(api, tmp_path)
    o.start()
    try:
        start = agent_session_event(session_id="as-thread", body="please [talk]")
        api.webhook(start)
        wait_for(lambda: ("response", "Finished.") in linear.said("as-thread"), what="the first run's end")
        api.webhook(agent_session_event(session_id="as-thread", action="prompted", body="now the docs"))
        wait_for(lambda: len(starts(o)) == 2, what="the follow-up's COMMAND")
        first, second = starts(o)
        assert second["kind"] == "prompt" and second["env"]["DEVPILOT_PROMPT"] == "now the docs"
        assert (
            first["cwd"]
            == second["cwd"]
            == first["env"]["DEVPILOT_WORKDIR"]
            == second["env"]["DEVPILOT_WORKDIR"]
        )
        assert first["env"]["DEVPILOT_TRANSCRIPT"] == second["env"]["DEVPILOT_TRANSCRIPT"]
        thread = second["transcript"]
        kinds = [(e["from"], e["kind"], e.get("type")) for e in thread]
        assert kinds == [
            ("user", "start", None),
            ("service", "activity", "thought"),  # Queued for laptop
            ("service", "activity", "thought"),  # Picked up by laptop
            ("agent", "activity", "thought"),  # COMMAND's own "working on: ..."
            ("agent", "activity", "response"),  # "Finished.", said by the orchestrator for it
            ("user", "prompt", None),
        ], kinds
        assert thread[0]["context"] == start["promptContext"] and thread[0]["guidance"] == start["guidance"]
        assert thread[-1]["body"] == "now the docs"
        assert [e["body"] for e in thread[1:3]] == ["Queued for laptop", "Picked up by laptop"]
    finally:
        assert o.stop() == 0


def test_sigkill_between_the_inbox_and_the_ack_delivers_the_follow_up_exactly_once(
    api: Api, linear: Linear, tmp_path: Path, db_url: str
) -> None:
    """The follow-up is written into the running agent's inbox (and read by it), and its ack is held
    in the database (a test trigger waits on a lock before a prompt's session is marked delivered);
    the orchestrator is SIGKILLed there and the ack cancelled, so it never happened. The next run
    acks it again and writes nothing twice: the agent read it once, and no second COMMAND ran."""
    o = machine(api, tmp_path)
    o.start()
    api.webhook(agent_session_event(session_id="as-kill", body="please [listen]"))
    wait_for(lambda: len(starts(o)) == 1, what="the agent running")
    agent_pid = starts(o)[0]["pid"]
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(HOLD_PROMPT_ACKS)
        admin.execute("SELECT pg_advisory_lock(4242)")
        api.webhook(agent_session_event(session_id="as-kill", action="prompted", body="once only"))
        wait_for(lambda: acks_waiting(db_url), timeout=20, what="the follow-up's ack in flight")
        wait_for(lambda: len(reads(o)) == 1, timeout=20, what="the follow-up in the inbox, read")
        o.signal(signal.SIGKILL)  # in the inbox, the ack not answered
        assert o.proc is not None
        o.proc.wait()
        admin.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event = 'advisory'"
        )  # the ack never happened
        admin.execute("SELECT pg_advisory_unlock(4242)")
        admin.execute("DROP TRIGGER test_hold_prompt_acks ON dispatch_sessions")
        queued = admin.execute(
            "SELECT count(*) FROM dispatch_sessions WHERE agent_session_id = 'as-kill' AND status = 'queued'"
        ).fetchone()
    assert queued is not None and queued[0] == 1
    o.start()  # the next run acks it, writing nothing twice
    api.webhook(agent_session_event(session_id="as-kill", action="prompted", body="[done]"))
    wait_for(lambda: ("response", "read 2 follow-up(s)") in linear.said("as-kill"), what="the agent's answer")
    assert [r["body"] for r in reads(o)] == ["once only", "[done]"]
    assert {r["pid"] for r in reads(o)} == {agent_pid} and len(starts(o)) == 1
    with api.pool.connection() as conn:
        states = conn.execute(
            "SELECT kind, status FROM dispatch_sessions WHERE agent_session_id = 'as-kill' ORDER BY created_at"
        ).fetchall()
    assert [(s["kind"], s["status"]) for s in states] == [("start", "delivered")] + [
        ("prompt", "delivered")
    ] * 2
    assert o.stop() == 0


def follow_up_claimed(api: Api, o: Orch, session_id: str) -> dict[str, Any]:
    """The agent session's start delivered to `o`'s machine and its follow-up claimed by hand, as
    the machine's own claim would have taken it just before a crash: the claimed message."""
    api.webhook(agent_session_event(session_id=session_id))
    [start] = api.post_as(o.token, "/claim").json()["messages"]
    api.post_as(o.token, "/ack", {"queueId": start["queueId"], "claimToken": start["claimToken"]})
    api.webhook(agent_session_event(session_id=session_id, action="prompted", body="read before the crash"))
    [m] = api.post_as(o.token, "/claim").json()["messages"]
    return dict(m)


def test_a_follow_up_written_before_a_crash_is_never_written_again(api: Api, tmp_path: Path) -> None:
    """SIGKILLed after writing a follow-up into the inbox and before its journal said so: the agent
    had already read it (and removed it). The next run finds the write made (the inbox's link),
    acks it, and neither writes it again nor starts a COMMAND with it."""
    from orchestrator.conversations import Conversations, conversation_key
    from orchestrator.journal import Journal

    o = machine(api, tmp_path)
    m = follow_up_claimed(api, o, "as-crash")
    journal = Journal(o.state / "journal.sqlite3")
    journal.record(m)  # journaled, not yet marked inboxed
    journal.close()
    conversations = Conversations(o.state)
    conv = conversations.of(conversation_key(m))
    conversations.put(conv, m)
    for path in conv.inbox.iterdir():
        path.unlink()  # the running agent read it
    o.start()
    try:
        wait_for(lambda: "acked ENG-7" in o.log(), what="the follow-up acked by the next run")
        time.sleep(1.0)
        assert list(conv.inbox.iterdir()) == [] and starts(o) == []
        with api.pool.connection() as conn:
            row = conn.execute(
                "SELECT status FROM dispatch_sessions WHERE message_id = %s", (m["messageId"],)
            ).fetchone()
        assert row is not None and row["status"] == "delivered"
    finally:
        assert o.stop() == 0


def test_an_agent_that_asks_is_not_answered_finished_and_gets_the_choice_with_its_signal(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    o = machine(api, tmp_path)
    o.start()
    try:
        api.webhook(agent_session_event(session_id="as-ask", body="please [ask]"))
        wait_for(lambda: ("elicitation", "Which database?") in linear.said("as-ask"), what="the question")
        [ask] = [a for a in linear.activities() if a["agentSessionId"] == "as-ask" and a.get("signal")]
        assert ask["signal"] == "select" and ask["signalMetadata"] == {
            "options": [{"label": "Postgres", "value": "Postgres"}, {"label": "SQLite", "value": "SQLite"}]
        }  # and the stand-in checked it against Linear's schema
        time.sleep(1.0)
        assert "Finished." not in [b for _, b in linear.said("as-ask")]  # awaiting the person's answer
        choice = agent_session_event(
            session_id="as-ask",
            action="prompted",
            body="Postgres",
            signal="select",
            signal_metadata={"value": "Postgres"},
        )
        api.webhook(choice)
        wait_for(lambda: len(starts(o)) == 2, what="the answer's COMMAND")
        answer = starts(o)[1]
        assert (answer["env"]["DEVPILOT_PROMPT"], answer["env"]["DEVPILOT_SIGNAL"]) == ("Postgres", "select")
        assert answer["transcript"][-1]["signal"] == "select"
        assert ("agent", "elicitation") in [(e["from"], e.get("type")) for e in answer["transcript"]]
    finally:
        assert o.stop() == 0


SECRETS = {
    "DEVPILOT_ADMIN_TOKEN": "admin-secret-value",
    "DATABASE_URL": "postgresql://svc:db-password@db/devpilot",
    "LINEAR_WEBHOOK_SECRET": "webhook-secret-value",
    "LINEAR_CLIENT_SECRET": "client-secret-value",
    "DEVPILOT_ENCRYPTION_KEYS": "fernet-key-value",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value",
    "SECRET_X": "arbitrary-secret-value",
    "GITHUB_TOKEN": "ghp_not-passed",
}


def test_command_gets_a_clean_environment_and_only_what_is_passed_on_purpose(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    o = machine(
        api,
        tmp_path,
        "--pass-env",
        "AGENT_API_KEY",
        env={**SECRETS, "AGENT_API_KEY": "the-agents-own-key", "LC_ALL": "C.UTF-8", "TERM": "xterm"},
    )
    o.start()
    try:
        api.webhook(agent_session_event(session_id="as-env", body="please [talk]"))
        wait_for(lambda: ("response", "Finished.") in linear.said("as-env"), what="the agent's run")
        [run] = starts(o)
        env: dict[str, str] = run["allEnv"]
        for name, value in SECRETS.items():
            assert name not in env and value not in json.dumps(env), name
        assert env["AGENT_API_KEY"] == "the-agents-own-key"  # passed on purpose
        assert (env["LC_ALL"], env["TERM"]) == ("C.UTF-8", "xterm") and env["HOME"] and env["PATH"]
        allowed = {*BASICS, "AGENT_API_KEY"}
        assert {k for k in env if k not in allowed and not k.startswith(("DEVPILOT_", "LC_"))} == set()
        assert env["DEVPILOT_PROMPT"] and env["DEVPILOT_AGENT_SESSION_ID"] == "as-env"
    finally:
        assert o.stop() == 0


def started_with(api: Api, *flags: str) -> subprocess.CompletedProcess[str]:
    """The orchestrator started with `flags` for a registered machine (COMMAND `true`), to its
    exit: for the flags it refuses at start."""
    _, token = api.register(user="user-1")
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "--url", api.url, "--token", token, *flags, "--", "true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_pass_env_never_passes_the_machines_token(api: Api, tmp_path: Path) -> None:
    r = started_with(api, "--pass-env", "DEVPILOT_ORCHESTRATOR_TOKEN")
    assert r.returncode == 2 and "never gets the machine's token" in r.stderr


def test_two_conversations_with_worktrees_never_share_a_checkout_and_theirs_go_at_the_end(
    api: Api, linear: Linear, tmp_path: Path, repo: Path
) -> None:
    o = machine(api, tmp_path, "--worktree", "--pass-env", "PYTHONPATH", cwd=repo)
    o.start()
    try:
        for sid in ("as-wt-1", "as-wt-2"):
            api.webhook(agent_session_event(session_id=sid, issue_id=f"iss-{sid}", body="please [listen]"))
        wait_for(lambda: len(starts(o)) == 2, what="both agents running")
        one, two = sorted(starts(o), key=lambda s: s["env"]["DEVPILOT_AGENT_SESSION_ID"])
        assert one["cwd"] != two["cwd"] and Path(one["cwd"]).is_dir() and Path(two["cwd"]).is_dir()
        for run in (one, two):
            assert run["cwd"] == run["env"]["DEVPILOT_WORKDIR"]
            assert (Path(run["cwd"]) / "README").read_text() == "checkout\n"  # a checkout of the repository
            assert not run["cwd"].startswith(str(repo) + "/")

        def branches() -> list[str]:
            listed = subprocess.run(["git", "branch", "--list"], cwd=repo, capture_output=True, text=True)
            return [b.strip("*+ ") for b in listed.stdout.splitlines()]

        def on(cwd: str, *args: str) -> str:
            return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout

        branch = {run["cwd"]: on(run["cwd"], "symbolic-ref", "--short", "HEAD").strip() for run in (one, two)}
        assert sorted(branches()) == sorted(["main", *branch.values()])
        # Named for the issue (ENG-7), so Linear links a pull request made from one to it.
        assert sorted(branch.values()) == ["devpilot/eng-7-as-wt-1", "devpilot/eng-7-as-wt-2"]
        # the agent of the first commits its work; the second's leaves nothing on its branch
        (Path(one["cwd"]) / "fix.txt").write_text("the fix\n")
        on(one["cwd"], "add", "fix.txt")
        on(one["cwd"], "commit", "-q", "-m", "the fix")
        for sid in ("as-wt-1", "as-wt-2"):
            api.webhook(agent_session_event(session_id=sid, action="prompted", body="[done]"))
        for sid in ("as-wt-1", "as-wt-2"):
            wait_for(
                lambda sid=sid: ("response", "read 1 follow-up(s)") in linear.said(sid), what=f"{sid} ends"
            )
        wait_for(
            lambda: not Path(one["cwd"]).exists() and not Path(two["cwd"]).exists(),
            timeout=10,
            what="worktrees removed",
        )

        def worktrees() -> str:
            return subprocess.run(
                ["git", "worktree", "list"], cwd=repo, capture_output=True, text=True
            ).stdout

        # only the checkout itself (git forgets a worktree a moment after its folder has gone)
        wait_for(lambda: worktrees().count("\n") == 1, timeout=10, what=f"git forgetting them: {worktrees()}")
        # the branch with the agent's commit stays (and the log says so); the empty one went with its worktree
        assert sorted(branches()) == sorted(["main", branch[one["cwd"]]])
        assert on(str(repo), "log", "-1", "--format=%s", branch[one["cwd"]]).strip() == "the fix"
        assert f"its branch {branch[one['cwd']]} stays (it has commits)" in o.log()
    finally:
        assert o.stop() == 0
