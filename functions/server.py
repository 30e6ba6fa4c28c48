"""`devpilot serve`: every target on one port, through one small dispatcher over the same handler
functions that functions-framework serves one by one, plus the in-process sweep."""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from functions import runtime
from functions.main import TARGETS
from functions.sweep import run_sweep
from functions.web import error, json_http_errors, setup_logging
from shared.db import open_pool
from shared.embedded import resolve
from shared.migrate import migrate
from shared.settings import get_settings
from shared.wakeups import Wakeups

log = logging.getLogger("devpilot.serve")

# URL path (first segment) -> target. Only /orchestrators has sub-paths.
ROUTES: dict[str, str] = {
    "webhook": "webhook",
    "claim": "claim",
    "ack": "ack",
    "release": "release",
    "sweep": "sweep",
    "orchestrators": "orchestrators",
    "realtime-token": "realtime_token",
    "healthz": "healthz",
    "metrics": "metrics",
    "dashboard": "dashboard",
    "linear-credentials": "linear_credentials",
}
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_app(handlers: Mapping[str, Callable[[flask.Request], Any]] | None = None) -> flask.Flask:
    table = handlers or TARGETS
    app = flask.Flask("devpilot")

    @app.route("/", defaults={"path": ""}, methods=ALL_METHODS)
    @app.route("/<path:path>", methods=ALL_METHODS)
    def dispatch(path: str) -> flask.Response:
        parts = path.split("/")
        target = ROUTES.get(parts[0])
        if target is None or (
            len(parts) > 1 and target not in ("orchestrators", "dashboard", "linear_credentials")
        ):
            return error(404, "not_found", f"no route {flask.request.path}")
        return flask.make_response(table[target](flask.request))

    return json_http_errors(app)


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
