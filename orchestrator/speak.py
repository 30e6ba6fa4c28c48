"""`devpilot-orchestrator activity` and `plan`: what the agent COMMAND runs to speak in its own agent
session, through the service, with the token scoped to that session that the orchestrator put in
COMMAND's environment (never the machine's). How it is posted is `orchestrator.voice`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import voice
from orchestrator.client import Rejected, Unreachable

ACTIVITY_TYPES = ("thought", "action", "elicitation", "response", "error")
PLAN_STATUSES = ("pending", "inProgress", "completed", "canceled")


def activity_arguments(p: argparse.ArgumentParser) -> None:
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


def activity(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`devpilot-orchestrator activity [--type T] BODY`, run by the agent COMMAND: post to its own
    agent session through the service, with the token scoped to that session that the orchestrator
    put in COMMAND's environment (never the machine's)."""
    if (args.select or args.auth_url) and args.type not in ("thought", "elicitation"):
        p.error("--select and --auth-url make an elicitation")
    if args.select and args.auth_url:
        p.error("give --select or --auth-url, not both")
    _from_command(p, "activity")
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
    return _posted(
        p,
        lambda speaker: speaker.say(
            content, args.id, signal=signal.get("signal"), signal_metadata=signal.get("signalMetadata")
        ),
    )


def plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--step", action="append", metavar="TEXT[:STATUS]", help="a step, in order (repeatable)")
    p.add_argument(
        "--file", type=Path, help='the plan as JSON: [{"content": TEXT, "status": STATUS}, ...] ("-": stdin)'
    )


def plan(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`devpilot-orchestrator plan --step TEXT[:STATUS]... | --file JSON`, run by the agent COMMAND:
    replace its agent session's plan in Linear (each step pending, inProgress, completed or
    canceled; pending when no status is given) through the service, with the token scoped to that
    session that the orchestrator put in COMMAND's environment."""
    if bool(args.step) == bool(args.file):
        p.error("give the steps with --step, or a JSON file with --file")
    _from_command(p, "plan")
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
    return _posted(p, lambda speaker: speaker.plan(steps))


def _from_command(p: argparse.ArgumentParser, what: str) -> None:
    """Refused (exit 2) outside a COMMAND the orchestrator started: it has no agent session to speak in."""
    lacking = voice.missing(os.environ, what)
    if lacking:
        p.error(f"run this from the agent COMMAND the orchestrator started (missing {', '.join(lacking)})")


def _posted(p: argparse.ArgumentParser, post: Callable[[voice.Voice], str]) -> int:
    """Post through the service: 0 once queued; else 1, with the reason (the service away, the token
    refused, or the service's refusal) on stderr."""
    speaker = voice.Voice(os.environ)
    try:
        status = post(speaker)
    except (Unreachable, Rejected) as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        speaker.close()
    if status != "queued":
        print(f"{p.prog}: refused: {status}", file=sys.stderr)
        return 1
    return 0
