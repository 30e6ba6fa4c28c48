"""`devpilot-orchestrator --url URL [--token TOKEN] [--transport poll|listen|realtime] -- COMMAND...`

The token comes from DEVPILOT_ORCHESTRATOR_TOKEN (preferred: the process list shows --token).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.agent import TOKEN_ENV, Config, Orchestrator, default_state_dir


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="devpilot-orchestrator",
        description="Take this machine's work from devpilot-dispatch and start COMMAND per message.",
    )
    p.add_argument("--url", required=True, help="base URL of the service (devpilot serve or the functions)")
    p.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"orchestrator bearer token; prefer {TOKEN_ENV} (the process list shows --token)",
    )
    p.add_argument("--transport", choices=["poll", "listen", "realtime"], default="poll")
    p.add_argument("--poll-interval", type=float, default=5.0, help="seconds between polls (jittered)")
    p.add_argument(
        "--state-dir", type=Path, default=None, help=f"journal folder (default {default_state_dir()})"
    )
    p.add_argument("--max-parallel", type=int, default=4, help="commands running at once")
    p.add_argument("--json-logs", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND... (gets the message JSON on stdin)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if not args.token:
        parser.error("--token (or DEVPILOT_ORCHESTRATOR_TOKEN) is required")
    if args.poll_interval <= 0 or args.max_parallel < 1:
        parser.error("--poll-interval must be > 0 and --max-parallel >= 1")
    cfg = Config(
        url=args.url,
        token=args.token,
        command=command,
        transport=args.transport,
        poll_interval=args.poll_interval,
        state_dir=args.state_dir or default_state_dir(),
        max_parallel=args.max_parallel,
        json_logs=args.json_logs,
    )
    return Orchestrator(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
