"""`devpilot` console script: migrate, serve, sweep."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shared.embedded import resolve
from shared.settings import SettingsError, load_settings


def _cmd_migrate(args: argparse.Namespace) -> int:
    from shared.migrate import migrate

    settings = load_settings()
    db = resolve(settings.database_url)
    applied = migrate(db.url)
    if applied:
        print(f"applied {len(applied)} migration(s) to {db.describe()}: {', '.join(applied)}")
    else:
        print(f"schema up to date on {db.describe()}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from devpilot.serve import serve

    return serve(host=args.host, port=args.port, sweep_every=args.sweep_every)


def _cmd_status(args: argparse.Namespace) -> int:
    from devpilot.status_view import show
    from shared.db import open_pool
    from shared.status import snapshot

    settings = load_settings()
    db = resolve(settings.database_url)
    pool = open_pool(db.url, settings, max_size=1)
    try:
        show(snapshot(pool), as_json=args.json)
    finally:
        pool.close()
    return 0


def _cmd_linear_token(args: argparse.Namespace) -> int:
    from shared.db import open_pool
    from shared.linear_auth import store_static

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


def _cmd_demo(args: argparse.Namespace) -> int:
    from devpilot.demo import run_demo

    return run_demo()


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

    p = sub.add_parser("demo", help="the whole loop in under 30 s on an embedded database, then clean up")
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
