"""The machine's half of routing by repository, with real processes: two real orchestrators of one
person, each saying what it has (`--repo`, `--repo .`, `--label`) when it starts; each COMMAND runs
in its message's repository (with `--worktree`, in a worktree of that repository); a machine that
gets a repository it does not have gives the start back, and the service routes it to the one
that has it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.api import Api, agent_session_event
from tests.helpers.git import checkout
from tests.helpers.linear import Linear
from tests.test_machine_conversations import COMMAND, starts
from tests.test_orchestrator import ROOT, Orch, wait_for
from tests.test_repository_routing import BACKEND, WEB

DOCS = {"hostname": "github.com", "fullName": "acme/docs"}


def session_machine(api: Api, agent_session: str) -> str | None:
    with api.pool.connection() as conn:
        row = conn.execute(
            "SELECT orchestrator_id::text AS o FROM dispatch_sessions WHERE agent_session_id = %s AND status = 'queued'",
            (agent_session,),
        ).fetchone()
    return None if row is None else str(row["o"])


def listed(api: Api) -> dict[str, dict[str, Any]]:
    body = api.http.get("/orchestrators", headers=api.admin()).json()
    return {o["name"]: o for o in body["orchestrators"]}


def test_each_command_runs_in_its_repository_and_a_machine_without_it_gives_it_back(
    api: Api, linear: Linear, tmp_path: Path
) -> None:
    backend_repo = checkout(tmp_path / "src" / "backend")
    docs_repo = checkout(tmp_path / "src" / "docs", origin="https://ci:secret@github.com/acme/docs.git")
    web_repo = checkout(tmp_path / "src" / "web")
    _, backend_token = api.register(user="user-1", name="backend-box")
    web_id, web_token = api.register(user="user-1", name="web-box")
    # Before its orchestrator (re)starts, web-box still says it has acme/backend too, and it is the
    # most recently seen: the backend start is routed to it.
    assert api.post_as(backend_token, "/machine", {"repositories": [BACKEND, DOCS]}).status_code == 200
    assert api.post_as(web_token, "/machine", {"repositories": [BACKEND, WEB]}).status_code == 200
    linear.suggestions["iss-back"] = {"acme/backend": 0.9}
    linear.suggestions["iss-web"] = {"acme/web": 0.9}
    # ("[hold]": its COMMAND runs until released, so its worktree and branch are there to be seen)
    api.webhook(agent_session_event(session_id="as-back", issue_id="iss-back", body="please [hold]"))
    api.webhook(agent_session_event(session_id="as-web", issue_id="iss-web"))
    wait_for(
        lambda: session_machine(api, "as-back") == web_id, timeout=10, what="the backend start on web-box"
    )
    wait_for(lambda: session_machine(api, "as-web") == web_id, timeout=10, what="the web start on web-box")

    (tmp_path / "web").mkdir()
    (tmp_path / "backend").mkdir()
    web = Orch(
        api.url, web_token, tmp_path / "web", command=COMMAND, cwd=tmp_path,
        extra=["--repo", f"acme/web={web_repo}", "--label", "Frontend"],
    )  # fmt: skip
    backend = Orch(
        api.url, backend_token, tmp_path / "backend", command=COMMAND, cwd=docs_repo,
        extra=["--repo", f"acme/backend={backend_repo}", "--repo", ".", "--worktree", "--pass-env", "PYTHONPATH"],
    )  # fmt: skip
    web.start()
    backend.start()
    try:
        wait_for(
            lambda: len(starts(web)) == 1 and len(starts(backend)) == 1, what="one COMMAND on each machine"
        )
        [on_web], [on_backend] = starts(web), starts(backend)
        assert on_web["env"]["DEVPILOT_AGENT_SESSION_ID"] == "as-web"
        assert (on_web["cwd"], on_web["env"]["DEVPILOT_WORKDIR"]) == (str(web_repo), str(web_repo))
        assert on_web["env"]["DEVPILOT_REPOSITORY"] == "acme/web"
        assert on_backend["env"]["DEVPILOT_AGENT_SESSION_ID"] == "as-back"  # given back, routed again
        assert on_backend["env"]["DEVPILOT_REPOSITORY"] == "acme/backend"
        assert on_backend["cwd"] == on_backend["env"]["DEVPILOT_WORKDIR"]
        assert on_backend["cwd"].startswith(str(backend.state))  # the conversation's worktree...
        branches = subprocess.run(  # ...of acme/backend's checkout, not of the one it runs in
            ["git", "branch", "--list", "devpilot/*"],
            cwd=backend_repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "devpilot/eng-7-as-back" in branches
        Path(f"{backend.started_file}.release").touch()
        for other in (docs_repo, web_repo):
            assert (
                "devpilot/"
                not in subprocess.run(
                    ["git", "branch", "--list"], cwd=other, capture_output=True, text=True, check=True
                ).stdout
            )
        assert "no checkout of github.com/acme/backend here; given back" in web.log()
        machines = listed(api)  # what each said when it started (`--repo .` read origin's name)
        assert (machines["web-box"]["repositories"], machines["web-box"]["labels"]) == ([WEB], ["frontend"])
        assert machines["backend-box"]["repositories"] == [BACKEND, DOCS]
        assert "secret" not in backend.log() + web.log()
        # `whoami` says what the machine last told the service, as its orchestrator logged it
        for box, o, token in (("web-box", web, web_token), ("backend-box", backend, backend_token)):
            [logged] = [
                line.split("told the service: ", 1)[1]
                for line in o.log().splitlines()
                if "told the service: " in line
            ]
            who = subprocess.run(
                [sys.executable, "-m", "orchestrator.cli", "whoami", "--url", api.url, "--state-dir", str(tmp_path / box)],
                capture_output=True, text=True, timeout=30, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), "DEVPILOT_ORCHESTRATOR_TOKEN": token},
            )  # fmt: skip
            assert who.returncode == 0, who.stderr
            [said] = [line for line in who.stdout.splitlines() if line.startswith("told the service: ")]
            assert said.startswith(f"told the service: {logged.strip()} (") and said.endswith(" UTC)")
        assert logged.strip() == "repositories acme/backend, acme/docs; labels none"
    finally:
        assert web.stop() == 0
        assert backend.stop() == 0
    assert not linear.invalid, linear.invalid
