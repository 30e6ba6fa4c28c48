"""`devpilot-orchestrator`: the one command line. A first word that names a subcommand (the table
below) runs that subcommand; any other command line runs the orchestrator, which takes no word of
its own: `devpilot-orchestrator (--url BASE | --endpoints JSON_OR_FILE) [OPTION]... -- COMMAND...`
(its options: `orchestrator.options`).

Adding a subcommand = a function that adds its arguments to its parser and one that runs it
(`(parser, args) -> exit status`), in the module of its job, + one row below. `--help` lists every
row; `devpilot-orchestrator NAME --help` shows the subcommand's own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from orchestrator import login, options, speak
from orchestrator.loop import Orchestrator

PROG = "devpilot-orchestrator"


class Subcommand(NamedTuple):
    help: str  # its line in `devpilot-orchestrator --help`
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.ArgumentParser, argparse.Namespace], int]
    description: str | None = None  # its own `--help` opens with this (default: the line above)


SUBCOMMANDS: dict[str, Subcommand] = {
    "login": Subcommand(
        "register this machine for you, by signing in with Linear",
        login.login_arguments,
        login.login,
        login.LOGIN_DESCRIPTION,
    ),
    "whoami": Subcommand(
        "this machine: its workspace, person, and what it told the service",
        login.machine_arguments,
        login.whoami,
    ),
    "machines": Subcommand(
        "your machines: last seen, how each waits, what is queued", login.machine_arguments, login.machines
    ),
    "logout": Subcommand(
        "revoke this machine (its queued work moves to your other one)", login.machine_arguments, login.logout
    ),
    "activity": Subcommand(
        "post an activity to the agent session (run by COMMAND)",
        speak.activity_arguments,
        speak.activity,
        speak.activity.__doc__,
    ),
    "plan": Subcommand(
        "replace the agent session's plan in Linear (run by COMMAND)",
        speak.plan_arguments,
        speak.plan,
        speak.plan.__doc__,
    ),
}


def commands_help() -> str:
    lines = [f"  {name:<10} {sub.help}" for name, sub in SUBCOMMANDS.items()]
    return "commands (devpilot-orchestrator COMMAND --help for each):\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The run's parser: its `--help` lists the subcommands too."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Take this machine's work from devpilot-dispatch and start COMMAND per message.",
        epilog=commands_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.arguments(p)
    return p


def subcommand_parser(name: str) -> argparse.ArgumentParser:
    sub = SUBCOMMANDS[name]
    description = sub.description or sub.help[0].upper() + sub.help[1:] + "."
    p = argparse.ArgumentParser(prog=f"{PROG} {name}", description=description)
    sub.arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in SUBCOMMANDS:
        parser = subcommand_parser(argv[0])
        return SUBCOMMANDS[argv[0]].run(parser, parser.parse_args(argv[1:]))
    parser = build_parser()
    return Orchestrator(options.config(parser, parser.parse_args(argv))).run()


if __name__ == "__main__":
    sys.exit(main())
