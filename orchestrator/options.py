"""The run's command line: `devpilot-orchestrator (--url BASE | --endpoints JSON_OR_FILE) [--token TOKEN]
[--transport poll|listen|realtime] [--pass-env NAME]... [--repo [HOST/]OWNER/NAME=PATH]... [--label NAME]...
[--worktree] [--keep-days N] (-- COMMAND... | --agent NAME [--agent-arg ARG]...)`, its options read and
checked into a `Config` before anything starts.

The token comes from DEVPILOT_ORCHESTRATOR_TOKEN (preferred: the process list shows --token), or from
the login kept in the state directory (`devpilot-orchestrator login`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from orchestrator import repositories, runners, worktrees
from orchestrator.config import Config
from orchestrator.state import TOKEN_ENV, default_state_dir, stored
from shared.wire.messages import LABEL


def arguments(p: argparse.ArgumentParser) -> None:
    """The run's options, each with its help (`devpilot-orchestrator --help` shows them)."""
    p.add_argument("--url", help="one base URL serving every route (devpilot serve, or the `api` target)")
    p.add_argument(
        "--endpoints",
        default=os.environ.get("DEVPILOT_ENDPOINTS"),
        help="JSON (or a file holding it) mapping claim, ack, release, activities, plan, machine, "
        "realtimeToken to their own URLs, as deploy.sh prints it for a cloud deploy (or DEVPILOT_ENDPOINTS)",
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


def agent_command(name: str, agent_args: list[str], approval_timeout: float | None) -> list[str]:
    """`--agent NAME --agent-arg ARG...` as the COMMAND it is short for: devpilot-agent NAME ARG...
    (the one installed with this orchestrator, beside its interpreter; run from a checkout, the
    same module through this interpreter)."""
    script = Path(sys.executable).parent / "devpilot-agent"
    runner = [str(script)] if script.exists() else [sys.executable, "-m", "orchestrator.runners"]
    timeout = ["--approval-timeout", f"{approval_timeout:g}"] if approval_timeout is not None else []
    return [*runner, *timeout, name, *agent_args]


def fill(args: argparse.Namespace) -> None:
    """A machine that logged in takes its token, and its URL (or endpoints), from the state directory
    when neither the command line nor the environment gives one."""
    if args.token:
        return
    saved = stored(args.state_dir or default_state_dir())
    if saved is None:
        return
    args.token = saved["token"]
    if not args.url and not args.endpoints:
        args.url = saved.get("url")
        if isinstance(saved.get("endpoints"), dict):
            args.endpoints = json.dumps(saved["endpoints"])


def config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    """The run as `args` asks for it, or `parser.error` (exit 2) saying what is wrong."""
    fill(args)  # a machine that logged in: its token (and URL) from its state directory
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
    return Config(
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
