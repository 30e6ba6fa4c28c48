"""`devpilot-agent [--approval-timeout SECONDS] NAME [AGENT_ARG]...`: run the agent NAME's CLI as
this COMMAND (see `orchestrator.runners`). `devpilot-orchestrator --agent NAME [--agent-arg
ARG]...` is short for `devpilot-orchestrator ... -- devpilot-agent NAME ARG...`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from orchestrator.runners import AGENTS
from orchestrator.runners.runner import Options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="devpilot-agent",
        description="Run a coding agent's CLI as the orchestrator's COMMAND, its work live in Linear.",
    )
    p.add_argument(
        "--approval-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="how long a permission prompt or a question waits for the person in Linear before the "
        "agent is told no (default 900)",
    )
    p.add_argument(
        "--model-api-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long the agent may keep retrying a model API that does not answer before the run "
        "ends as an error (default 600; Codex would retry forever)",
    )
    p.add_argument("agent", choices=sorted(AGENTS), help="which agent's CLI to run")
    p.add_argument("agent_args", nargs=argparse.REMAINDER, help="passed to the agent's CLI as they are")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.approval_timeout <= 0 or args.model_api_timeout <= 0:
        build_parser().error("--approval-timeout and --model-api-timeout must be more than 0 seconds")
    runner = importlib.import_module(AGENTS[args.agent])
    options = Options(approval_timeout=args.approval_timeout, model_api_timeout=args.model_api_timeout)
    code: int = runner.run(args.agent_args, options)
    return code


if __name__ == "__main__":
    sys.exit(main())
