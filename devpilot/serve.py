"""`devpilot serve`: every route on one port (the same app as the `api` target, reading the one
route table), plus the in-process sweep."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication
from werkzeug.serving import WSGIRequestHandler

from functions import runtime
from functions.app import wsgi
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
    """For in-process test servers (Werkzeug, threaded): no access log (ours is structured), and a
    socket timeout so a client that never finishes its headers cannot hold a thread forever. What
    users run, `devpilot serve`, is gunicorn (below)."""

    timeout = 15

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


# One worker process (one pool, one LISTEN connection, one in-process sweep) with many threads:
# a waiting long-poll holds a thread and nothing else, so hundreds of them leave plenty for webhook
# intake; a client that sends nothing is handed back to gthread's poller, and one that trickles its
# headers is cut off after devpilot.worker.HEADER_DEADLINE seconds.
THREADS = 512
GRACEFUL_SECONDS = 5  # on SIGTERM: requests in flight finish (long-polls are cut short after this)


class ProductionServer(BaseApplication):  # type: ignore[misc]  # gunicorn ships no type hints
    """`devpilot serve` on gunicorn (gthread worker). The master migrates and binds; the worker
    builds the runtime after the fork (connections do not survive a fork) and runs the sweep."""

    def __init__(self, options: dict[str, Any], start: Callable[[], None], stop: Callable[[], None]) -> None:
        self.options, self.start, self.stop = options, start, stop
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)
        self.cfg.set("post_worker_init", lambda worker: self.start())
        self.cfg.set("worker_exit", lambda server, worker: self.stop())

    def load(self) -> Any:
        return wsgi


def serve(host: str = "127.0.0.1", port: int = 8080, sweep_every: float = 30.0) -> int:
    setup_logging()
    settings = get_settings()
    database = resolve(settings.database_url)
    applied = migrate(database.url)
    listener = socket.create_server((host, port))  # bound here, so port 0 is known before the fork
    listener.set_inheritable(True)
    url = f"http://{host}:{listener.getsockname()[1]}"
    stop = threading.Event()
    made: list[runtime.Runtime] = []

    def start_worker() -> None:
        pool = open_pool(database.url, settings)
        wakeups = Wakeups(settings.database_listen_url or database.url)
        made.append(runtime.Runtime(settings, database, pool, wakeups))
        runtime.install(made[0])
        wakeups.start()

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
        # Said once the worker can answer (it builds its runtime after the fork), so whoever reads
        # "serving on" may call at once.
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

    def stop_worker() -> None:
        stop.set()
        for rt in made:
            rt.wakeups.stop()
            rt.pool.close()

    options = {
        "bind": [f"fd://{listener.fileno()}"],
        "workers": 1,
        "worker_class": "devpilot.worker.DeadlineWorker",  # gthread, plus a deadline for headers
        "threads": THREADS,
        "worker_connections": THREADS * 2,
        "graceful_timeout": GRACEFUL_SECONDS,
        "timeout": 60,
        "keepalive": 5,
        "accesslog": None,  # every request already logs one structured line
        "errorlog": "-",
        "loglevel": "warning",
        "proc_name": "devpilot-serve",
    }
    master = os.getpid()
    try:
        ProductionServer(options, start_worker, stop_worker).run()
    except SystemExit as exc:  # gunicorn's master ends with sys.exit once its workers have stopped
        code = exc.code if isinstance(exc.code, int) else 0
    else:
        code = 0
    finally:
        # The forked worker unwinds through here too when it exits; only the master owns the
        # embedded database and says it stopped.
        if os.getpid() == master:
            if database.embedded and database.handle is not None:
                database.handle.cleanup()
            print("devpilot stopped", flush=True)
    return code
