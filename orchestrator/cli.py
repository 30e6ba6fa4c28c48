"""`devpilot-orchestrator --url URL [--token TOKEN] [--transport poll|listen|realtime] [--pass-env NAME]...
[--repo [HOST/]OWNER/NAME=PATH]... [--label NAME]... [--worktree] [--keep-days N] -- COMMAND...` and `devpilot-orchestrator activity [--type T] [--select OPTION]... [--auth-url URL]
BODY` (run by COMMAND).

The token comes from DEVPILOT_ORCHESTRATOR_TOKEN (preferred: the process list shows --token).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator import login, repositories, runners, voice, worktrees
from orchestrator.agent import TOKEN_ENV, Config, Orchestrator, default_state_dir
from orchestrator.client import Rejected, Unreachable
from shared.models import LABEL

# The commands besides running the orchestrator, each with its line in `--help`.
SUBCOMMANDS = {
    **login.HELP,
    "activity": "post an activity to the agent session (run by COMMAND)",
    "plan": "replace the agent session's plan in Linear (run by COMMAND)",
}


def commands_help() -> str:
    lines = [f"  {name:<10} {what}" for name, what in SUBCOMMANDS.items()]
    return "commands (devpilot-orchestrator COMMAND --help for each):\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="devpilot-orchestrator",
        description="Take this machine's work from devpilot-dispatch and start COMMAND per message.",
        epilog=commands_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", help="one base URL serving every route (devpilot serve, or the `api` target)")
    p.add_argument(
        "--endpoints",
        default=os.environ.get("DEVPILOT_ENDPOINTS"),
        help="JSON (or a file holding it) mapping claim, ack, release, activities, realtimeToken to their "
        "own URLs, as deploy.sh prints it for a cloud deploy (or DEVPILOT_ENDPOINTS)",
    )
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"orchestrator bearer token; prefer {TOKEN_ENV} (the process list shows --token)",
    )
    p.add_argument(
        "--transport",
        choices=["poll", "listen", "realtime"],
        default="poll",
        help="when to look for work: poll every interval; listen: long-polls (devpilot serve on a host "
        "you run); realtime: Supabase Realtime wake-ups, polling while the socket is away "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=5.0,
        help="seconds between polls, ±20%% (default: %(default)s)",
    )
    p.add_argument(
        "--state-dir", type=Path, default=None, help=f"journal folder (default {default_state_dir()})"
    )
    p.add_argument(
        "--max-parallel", type=int, default=4, help="commands running at once (default: %(default)s)"
    )
    p.add_argument(
        "--keep-days",
        type=int,
        default=14,
        metavar="N",
        help="remove from the state dir what finished over N days ago (conversations, each message's "
        "files, journal rows); 0: never (default: %(default)s)",
    )
    p.add_argument("--json-logs", action="store_true", help="log JSON lines (default: text)")
    p.add_argument(
        "--stop-grace",
        type=float,
        default=10.0,
        help="seconds between SIGTERM and SIGKILL on Linear's stop (default: %(default)s)",
    )
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="a variable of this environment COMMAND gets too (repeatable; e.g. the agent's API key). "
        "COMMAND gets only its own DEVPILOT_* variables, PATH, HOME, the locale, the terminal and the "
        "proxy settings otherwise",
    )
    p.add_argument(
        "--worktree",
        action="store_true",
        help="run each conversation in its own git worktree (of its repository, or of the checkout this "
        "runs in), removed when the conversation ends",
    )
    p.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="[HOST/]OWNER/NAME=PATH",
        help="a repository checked out on this machine, and where (repeatable; HOST defaults to github.com; "
        "`--repo .`: this checkout, named by its origin remote). The service routes a start about a "
        "repository to a machine that has it, and COMMAND runs in its path",
    )
    p.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="a label of this machine (repeatable): an issue with a Linear label of that name goes only to "
        "machines that have it",
    )
    p.add_argument(
        "--agent",
        choices=sorted(runners.AGENTS),
        help="run this coding agent's CLI as COMMAND, its work live in Linear: short for "
        "-- devpilot-agent NAME [ARG]...",
    )
    p.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="with --agent: a flag for the agent's CLI (repeatable; write --agent-arg=--model=NAME)",
    )
    p.add_argument(
        "--approval-timeout",
        type=float,
        metavar="SECONDS",
        help="with --agent: how long a permission prompt waits for the person in Linear before it is "
        "denied (default 900)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND... (gets the message JSON on stdin)")
    return p


def agent_command(name: str, agent_args: list[str], approval_timeout: float | None) -> list[str]:
    """`--agent NAME --agent-arg ARG...` as the COMMAND it is short for: devpilot-agent NAME ARG...
    (the one installed with this orchestrator, beside its interpreter; run from a checkout, the
    same module through this interpreter)."""
    script = Path(sys.executable).parent / "devpilot-agent"
    runner = [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator.runners"]
    timeout = ["--approval-timeout", f"{approval_timeout:g}"] if approval_timeout is not None else []
    return [*runner, *timeout, name, *agent_args]


ACTIVITY_TYPES = ("thought", "action", "elicitation", "response", "error")


def activity(argv: Sequence[str]) -> int:
    """`devpilot-orchestrator activity [--type T] BODY`, run by the agent COMMAND: post to its own
    agent session through the service, with the token scoped to that session that the orchestrator
    put in COMMAND's environment (never the machine's)."""
    p = argparse.ArgumentParser(prog="devpilot-orchestrator activity", description=activity.__doc__)
    p.add_argument("--type", choices=ACTIVITY_TYPES, default="thought")
    p.add_argument("--action", help="with --type action: what is being done (BODY is its parameter)")
    p.add_argument("--result", help="with --type action: its result")
    p.add_argument("--id", help="a UUID of your own: posting it again never shows twice")
    p.add_argument(
        "--select",
        action="append",
        metavar="OPTION",
        help="an elicitation the person answers by picking one of these (repeatable; Linear's select signal)",
    )
    p.add_argument(
        "--auth-url", help="an elicitation with a link to connect an account (Linear's auth signal)"
    )
    p.add_argument("--provider", help="with --auth-url: the service's name, as Linear shows it")
    p.add_argument("body", help="the text (for an action, its parameter)")
    args = p.parse_args(argv)
    if (args.select or args.auth_url) and args.type not in ("thought", "elicitation"):
        p.error("--select and --auth-url make an elicitation")
    if args.select and args.auth_url:
        p.error("give --select or --auth-url, not both")
    lacking = voice.missing(os.environ, "activity")
    if lacking:
        p.error(f"run this from the agent COMMAND the orchestrator started (missing {', '.join(lacking)})")
    if args.type == "action":
        if not args.action:
            p.error("--type action needs --action")
        content = {"type": "action", "action": args.action, "parameter": args.body}
        if args.result is not None:
            content["result"] = args.result
    else:
        content = {"type": "elicitation" if args.select or args.auth_url else args.type, "body": args.body}
    signal: dict[str, Any] = {}
    if args.select:
        signal = {
            "signal": "select",
            "signalMetadata": {"options": [{"label": o, "value": o} for o in args.select]},
        }
    elif args.auth_url:
        meta = {"url": args.auth_url, **({"providerName": args.provider} if args.provider else {})}
        signal = {"signal": "auth", "signalMetadata": meta}
    speaker = voice.Voice(os.environ)
    try:
        status = speaker.say(
            content, args.id, signal=signal.get("signal"), signal_metadata=signal.get("signalMetadata")
        )
    except (Unreachable, Rejected) as exc:
        print(f"devpilot-orchestrator activity: {exc}", file=sys.stderr)
        return 1
    finally:
        speaker.close()
    if status != "queued":
        print(f"devpilot-orchestrator activity: refused: {status}", file=sys.stderr)
        return 1
    return 0


PLAN_STATUSES = ("pending", "inProgress", "completed", "canceled")


def plan(argv: Sequence[str]) -> int:
    """`devpilot-orchestrator plan --step TEXT[:STATUS]... | --file JSON`, run by the agent COMMAND:
    replace its agent session's plan in Linear (each step pending, inProgress, completed or
    canceled; pending when no status is given) through the service, with the token scoped to that
    session that the orchestrator put in COMMAND's environment."""
    p = argparse.ArgumentParser(prog="devpilot-orchestrator plan", description=plan.__doc__)
    p.add_argument("--step", action="append", metavar="TEXT[:STATUS]", help="a step, in order (repeatable)")
    p.add_argument(
        "--file", type=Path, help='the plan as JSON: [{"content": TEXT, "status": STATUS}, ...] ("-": stdin)'
    )
    args = p.parse_args(argv)
    if bool(args.step) == bool(args.file):
        p.error("give the steps with --step, or a JSON file with --file")
    lacking = voice.missing(os.environ, "plan")
    if lacking:
        p.error(f"run this from the agent COMMAND the orchestrator started (missing {', '.join(lacking)})")
    steps: list[dict[str, str]] = []
    if args.step:
        for raw in args.step:
            text, _, status = raw.rpartition(":")
            if not text or status not in PLAN_STATUSES:  # no status given (or a colon in the text)
                text, status = raw, "pending"
            steps.append({"content": text, "status": status})
    else:
        try:
            loaded = json.loads(sys.stdin.read() if str(args.file) == "-" else args.file.read_text())
        except (OSError, ValueError) as exc:
            p.error(f"--file: {exc}")
        ok = isinstance(loaded, list) and all(
            isinstance(s, dict) and isinstance(s.get("content"), str) and s.get("status") in PLAN_STATUSES
            for s in loaded
        )
        if not ok or not loaded:
            p.error(
                f'--file must hold a list of {{"content", "status"}} with status one of {", ".join(PLAN_STATUSES)}'
            )
        steps = [{"content": s["content"], "status": s["status"]} for s in loaded]
    speaker = voice.Voice(os.environ)
    try:
        status = speaker.plan(steps)
    except (Unreachable, Rejected) as exc:
        print(f"devpilot-orchestrator plan: {exc}", file=sys.stderr)
        return 1
    finally:
        speaker.close()
    if status != "queued":
        print(f"devpilot-orchestrator plan: refused: {status}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["activity"]:
        return activity(argv[1:])
    if argv[:1] and argv[0] in login.COMMANDS:
        return login.main(argv)
    if argv[:1] == ["plan"]:
        return plan(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    login.fill(args)  # a machine that logged in: its token (and URL) from its state directory
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.agent and command:
        parser.error("give --agent NAME or -- COMMAND, not both")
    if (args.agent_arg or args.approval_timeout is not None) and not args.agent:
        parser.error("--agent-arg and --approval-timeout go with --agent")
    if args.approval_timeout is not None and args.approval_timeout <= 0:
        parser.error("--approval-timeout must be more than 0 seconds")
    if args.agent:
        command = agent_command(args.agent, args.agent_arg, args.approval_timeout)
    if not command:
        parser.error("give the command to run after -- (or --agent claude|codex)")
    if not args.token:
        parser.error(
            "--token (or DEVPILOT_ORCHESTRATOR_TOKEN) is required, or `devpilot-orchestrator login` first"
        )
    if args.poll_interval <= 0 or args.max_parallel < 1:
        parser.error("--poll-interval must be > 0 and --max-parallel >= 1")
    if args.keep_days < 0:
        parser.error("--keep-days must be 1 or more (days), or 0 to never remove anything")
    if TOKEN_ENV in args.pass_env:
        parser.error(f"--pass-env {TOKEN_ENV}: COMMAND never gets the machine's token")
    workdir = Path.cwd()
    try:
        repos = [repositories.parse(spec, workdir) for spec in args.repo]
    except repositories.RepoSpecError as exc:
        parser.error(str(exc))
    labels = [label.strip() for label in args.label]
    if not all(LABEL.match(label) for label in labels):
        parser.error("--label: 1 to 64 printable characters")
    if args.worktree:
        top = worktrees.toplevel(workdir)
        if top is None and not repos:
            parser.error(
                "--worktree: run the orchestrator inside the git checkout COMMAND works on, or give --repo"
            )
        workdir = top or workdir
    endpoints: dict[str, str] | None = None
    if args.endpoints:
        try:
            text = (
                Path(args.endpoints).read_text()
                if not args.endpoints.lstrip().startswith("{")
                else args.endpoints
            )
            endpoints = json.loads(text)
        except (OSError, ValueError) as exc:
            parser.error(f"--endpoints is neither a JSON object nor a file holding one: {exc}")
        if not isinstance(endpoints, dict) or not all(
            isinstance(endpoints.get(k), str) for k in ("claim", "ack")
        ):
            parser.error("--endpoints must map at least claim and ack to URLs")
    if not args.url and not endpoints:
        parser.error("give --url (one base URL) or --endpoints (each route's URL)")
    cfg = Config(
        endpoints=endpoints,
        url=args.url,
        token=args.token,
        command=command,
        transport=args.transport,
        poll_interval=args.poll_interval,
        state_dir=args.state_dir or default_state_dir(),
        max_parallel=args.max_parallel,
        json_logs=args.json_logs,
        stop_grace=args.stop_grace,
        pass_env=args.pass_env,
        worktree=args.worktree,
        workdir=workdir,
        repositories=repos,
        labels=labels,
        keep_days=args.keep_days,
    )
    return Orchestrator(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
