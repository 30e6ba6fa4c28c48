"""`devpilot serve`: every route on one port (the same app as the `api` target, reading the one
route table), plus the in-process sweep."""

from __future__ import annotations

import json
import logging
import signal
import threading
from types import FrameType

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from functions import runtime
from functions.app import create_app
from functions.logs import setup_logging
from functions.sweep import run_sweep
from shared import crypto
from shared.db import open_pool
from shared.embedded import resolve
from shared.migrate import migrate
from shared.settings import Settings, get_settings
from shared.wakeups import Wakeups

log = logging.getLogger("devpilot.serve")


def configuration_report(settings: Settings) -> list[str]:
    """What a new operator needs to know at start: which routes will refuse for want of a setting."""

    def state(value: object, unset: str) -> str:
        return "set" if value else unset

    lines = [
        f"admin token (DEVPILOT_ADMIN_TOKEN): {state(settings.admin_token, 'NOT SET: admin routes and /sweep answer 401')}",
        "webhook secret (LINEAR_WEBHOOK_SECRET): "
        + state(settings.linear_webhook_secret, "NOT SET: /webhook answers 503"),
    ]
    try:
        crypto.keys(settings)
        keys = "set" if settings.encryption_keys else "generated under ./.devpilot/ (embedded database)"
    except crypto.NotConfigured:
        keys = "NOT SET: storing a Linear token answers 503 encryption_not_configured"
    lines.append(f"encryption keys (DEVPILOT_ENCRYPTION_KEYS): {keys}")
    lines.append("Linear OAuth install: " + ("on (/oauth/install)" if settings.oauth_enabled else "off"))
    return lines


class QuietHandler(WSGIRequestHandler):
    """Werkzeug's threaded handler, without its access log (ours is structured), and with a socket
    timeout so a client that never finishes its headers cannot hold a thread forever."""

    timeout = 15

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


def serve(host: str = "127.0.0.1", port: int = 8080, sweep_every: float = 30.0) -> int:
    setup_logging()
    settings = get_settings()
    database = resolve(settings.database_url)
    applied = migrate(database.url)
    pool = open_pool(database.url, settings)
    wakeups = Wakeups(settings.database_listen_url or database.url)
    runtime.install(runtime.Runtime(settings, database, pool, wakeups))
    wakeups.start()

    server: BaseWSGIServer = make_server(
        host, port, create_app(), threaded=True, request_handler=QuietHandler
    )
    stop = threading.Event()

    def sweeper() -> None:
        while not stop.wait(sweep_every):
            try:
                r = run_sweep()  # counted in /metrics like a scheduled sweep
                if r["requeued"] or r["deadLettered"]:
                    log.info(json.dumps({"event": "sweep", **r}))
            except Exception as exc:  # the next round retries; the table keeps the truth
                log.warning("sweep failed: %s", exc)

    if sweep_every > 0:
        threading.Thread(target=sweeper, name="devpilot-sweep", daemon=True).start()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    url = f"http://{server.host}:{server.port}"
    print(f"devpilot serving on {url}", flush=True)
    print(
        f"database: {database.describe()}"
        + (" (embedded; set DATABASE_URL to use your own)" if database.embedded else ""),
        flush=True,
    )
    if applied:
        print(f"migrations applied: {', '.join(applied)}", flush=True)
    for line in configuration_report(settings):
        print(line, flush=True)
    print(f"sweep: every {sweep_every:g}s" if sweep_every > 0 else "sweep: off", flush=True)
    try:
        server.serve_forever()
    finally:
        stop.set()
        wakeups.stop()
        pool.close()
        if database.embedded and database.handle is not None:
            database.handle.cleanup()
        print("devpilot stopped", flush=True)
    return 0
