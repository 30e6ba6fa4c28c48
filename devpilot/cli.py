"""`devpilot` console script: migrate, serve, status, sessions, linear-token, demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shared.plumbing.embedded import resolve
from shared.plumbing.settings import SettingsError, load_settings


def _cmd_migrate(args: argparse.Namespace) -> int:
    from shared.plumbing.migrate import migrate

    settings = load_settings()
    db = resolve(settings.database_url)
    applied = migrate(db.url)
    if applied:
        print(f"applied {len(applied)} migration(s) to {db.describe()}: {', '.join(applied)}")
    else:
        print(f"schema up to date on {db.describe()}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from devpilot.serve import PortInUse, serve

    try:
        return serve(host=args.host, port=args.port, sweep_every=args.sweep_every)
    except PortInUse as exc:
        print(f"devpilot serve: {exc}", file=sys.stderr)
        return 1


def _cmd_status(args: argparse.Namespace) -> int:
    from psycopg.errors import UndefinedTable

    from devpilot.status_view import show
    from shared.operators.status import snapshot
    from shared.plumbing.db import open_pool

    settings = load_settings()
    db = resolve(settings.database_url)
    pool = open_pool(db.url, settings, max_size=1)
    try:
        show(snapshot(pool), as_json=args.json)
    except UndefinedTable:  # (a fresh database: nothing has migrated it yet)
        print(
            f"devpilot status: {db.describe()} has no devpilot schema yet: run `devpilot migrate` "
            "(`devpilot serve` migrates too)",
            file=sys.stderr,
        )
        return 1
    finally:
        pool.close()
    return 0


def _cmd_linear_token(args: argparse.Namespace) -> int:
    from shared.linear.auth import store_static
    from shared.plumbing.db import open_pool

    token = sys.stdin.readline().strip()
    if not token:
        print("devpilot linear-token: give the Linear access token on stdin", file=sys.stderr)
        return 2
    settings = load_settings()
    db = resolve(settings.database_url)
    pool = open_pool(db.url, settings, max_size=1)
    try:
        store_static(pool, settings, args.org_id, token)
    finally:
        pool.close()
    print(f"stored the Linear token for org {args.org_id} (encrypted)")
    return 0


def _cmd_sessions(args: argparse.Namespace) -> int:
    """`devpilot sessions retry|cancel|move ID [--to MACHINE]`: an operator's action on a session,
    as the page's buttons and the admin routes do it (one transaction, recorded as done by this
    user on this host), then what Linear hears is posted."""
    import getpass
    import socket
    from uuid import UUID

    from shared.dispatch import Dispatch
    from shared.operators import sessions
    from shared.plumbing.db import open_pool

    try:
        session_id = UUID(args.session_id)
    except ValueError:
        print(f"devpilot sessions: {args.session_id!r} is not a session id", file=sys.stderr)
        return 2
    if (args.action == "move") != (args.to is not None):
        print("devpilot sessions: --to MACHINE goes with move, and only with it", file=sys.stderr)
        return 2
    settings = load_settings()
    db = resolve(settings.database_url)
    pool = open_pool(db.url, settings, max_size=2)
    service = Dispatch(pool, settings)
    try:
        target = sessions.machine_named(pool, args.to) if args.to else None
        acted = service.act_on_session(
            session_id, args.action, f"cli {getpass.getuser()}@{socket.gethostname()}", target
        )
        if acted.notice_ids:  # Linear hears it before the process ends (the sweep would send it later)
            from shared.linear import notices

            notices.send_pending(pool, settings, ids=acted.notice_ids)
    except sessions.NotFound:
        print(f"devpilot sessions: no session {session_id}", file=sys.stderr)
        return 1
    except sessions.NotAllowed as exc:
        print(f"devpilot sessions: not allowed: {exc}", file=sys.stderr)
        return 1
    finally:
        service.close()
        pool.close()
    print(f"{session_id}: {acted.detail} ({acted.status})")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from devpilot.demo import run_demo

    return run_demo(args.agent)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="devpilot", description="devpilot-dispatch service")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="apply the schema to DATABASE_URL (idempotent)")
    p.set_defaults(func=_cmd_migrate)

    p = sub.add_parser(
        "serve",
        help="migrate, then serve every route on one port",
        epilog="Worker processes: DEVPILOT_SERVE_WORKERS (default 1; one worker uses about one core).",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--sweep-every", type=float, default=30.0, help="seconds between in-process sweeps; 0 = off"
    )
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("status", help="per orchestrator backlog, recent failures, last sweep")
    p.add_argument("--json", action="store_true", help="JSON even on a terminal")
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("linear-token", help="store an org's Linear app access token (read from stdin)")
    p.add_argument("org_id")
    p.set_defaults(func=_cmd_linear_token)

    p = sub.add_parser("sessions", help="act on a session as an operator: retry, cancel or move it")
    p.add_argument("action", choices=["retry", "cancel", "move"])
    p.add_argument("session_id", metavar="ID")
    p.add_argument("--to", metavar="MACHINE", help="move: the machine (its name or id) to move it to")
    p.set_defaults(func=_cmd_sessions)

    p = sub.add_parser("demo", help="the whole loop in about 10 s on an embedded database, then clean up")
    p.add_argument(
        "--agent",
        choices=["claude", "codex"],
        help="the real Claude Code or Codex CLI (pinned; installed with python -m devpilot.agent_clis) "
        "works on an issue, through a scripted stand-in of its model",
    )
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except SettingsError as exc:
        print(f"devpilot: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
