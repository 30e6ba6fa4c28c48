"""`devpilot serve`: every route on one port (the same app as the `api` target, reading the one
route table), plus the in-process sweep."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from werkzeug.serving import WSGIRequestHandler

from devpilot.master import SignalSafeServer, listen
from functions import runtime
from functions.app import wsgi
from functions.logs import flush_logs, setup_logging
from functions.sweep import run_sweep
from shared.delivery.wakeups import Wakeups
from shared.plumbing import crypto, local_secrets
from shared.plumbing.db import open_pool
from shared.plumbing.embedded import resolve
from shared.plumbing.migrate import migrate
from shared.plumbing.settings import Settings, get_settings

log = logging.getLogger("devpilot.serve")


def configuration_report(settings: Settings, kept: list[local_secrets.Kept] | None = None) -> list[str]:
    """What a new operator needs to know at start: which routes will refuse for want of a setting,
    and where the secrets generated for a developer's machine are (never their values)."""
    files = {k.variable: k for k in kept or []}

    def state(variable: str, value: object, unset: str) -> str:
        if variable in files:
            k = files[variable]
            how = "generated on this first start" if k.created else "from an earlier start"
            return f"{how}, kept in {k.path} (mode 0600; read it with: cat {k.path})"
        return "set" if value else unset

    lines = [
        "admin token (DEVPILOT_ADMIN_TOKEN): "
        + state("DEVPILOT_ADMIN_TOKEN", settings.admin_token, "NOT SET: admin routes and /sweep answer 401"),
        "webhook secret (LINEAR_WEBHOOK_SECRET): "
        + state("LINEAR_WEBHOOK_SECRET", settings.linear_webhook_secret, "NOT SET: /webhook answers 503"),
    ]
    try:
        crypto.keys(settings)
        keys = "set" if settings.encryption_keys else "generated under ./.devpilot/ (embedded database)"
    except crypto.NotConfigured:
        keys = "NOT SET: storing a Linear token answers 503 encryption_not_configured"
    lines.append(f"encryption keys (DEVPILOT_ENCRYPTION_KEYS): {keys}")
    lines.append("Linear OAuth install: " + ("on (/oauth/install)" if settings.oauth_enabled else "off"))
    lines.append(
        "people connect machines (devpilot-orchestrator login): "
        + (
            "on (/enroll, /me)"
            if settings.signin_enabled
            else "off (needs DEVPILOT_PUBLIC_URL and a Linear OAuth client)"
        )
    )
    return lines


class QuietHandler(WSGIRequestHandler):
    """For in-process test servers (Werkzeug, threaded): no access log (ours is structured), and a
    socket timeout so a client that never finishes its headers cannot hold a thread forever. What
    users run, `devpilot serve`, is Granian (below)."""

    timeout = 15

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


# Worker processes on Granian (DEVPILOT_SERVE_WORKERS, default one), each with its own pool and
# LISTEN connection; the first one also runs the in-process sweep. Granian's HTTP (hyper, in Rust)
# reads requests without a Python thread, so a client that trickles its headers holds nothing and
# is cut off after HEADER_DEADLINE; a request's WSGI call then runs on one of THREADS blocking
# threads, where a waiting long-poll holds a thread and nothing else. More than one worker is how
# serve uses more than one core: one Python process runs one thread at a time.
THREADS = 512
BACKLOG = 1024  # connections the kernel holds for the workers to accept (Granian's default)
HEADER_DEADLINE = 10.0
GRACEFUL_SECONDS = 5  # on SIGTERM: requests in flight finish (long-polls are cut short after this)

_worker: dict[str, Callable[[], None]] = {}  # set by serve() in the master, inherited by the fork
_master: dict[str, int] = {}  # the master's pid, likewise (a worker's parent, until the master dies)
# Only one worker announces and sweeps: each takes the next number from a counter the master made
# before forking. (A worker that dies is not respawned: Granian's master then stops, so numbers are
# never taken twice.)
_FIRST = 0


def worker_app() -> Any:
    """Granian's app factory: runs in the worker process, after the fork (connections do not
    survive a fork), so the runtime is built here; and the worker ends with its master."""
    _worker["start"]()
    # The worker is a multiprocessing child, which leaves through os._exit: atexit hooks never run
    # there, multiprocessing's finalizers do (once Granian's worker has stopped serving).
    multiprocessing.util.Finalize(None, _worker["stop"], exitpriority=10)
    # The master's pid as the master knew it before the fork, not our parent's now: a master
    # SIGKILLed before this line ran has left us to another parent already, which we would
    # otherwise take for our master and outlive it.
    parent = _master["pid"]

    def orphaned() -> None:  # a SIGKILLed master cannot stop us: leave with it
        while os.getppid() == parent:
            time.sleep(0.5)
        _worker["orphaned"]()
        flush_logs()
        os._exit(0)

    threading.Thread(target=orphaned, name="devpilot-parent-watch", daemon=True).start()
    return wsgi


def _wait_listening(host: str, port: int, timeout: float = 60.0) -> None:
    """Until something accepts connections on (host, port): the worker's own socket (an address
    that means "every interface" is reached through loopback)."""
    target = host or "127.0.0.1"
    with contextlib.suppress(ValueError):  # (a host name is connected to as it is)
        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            target = "::1" if ip.version == 6 else "127.0.0.1"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((target, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)


def _shared_metrics(workers: int) -> str | None:
    """With several workers, /metrics must count every worker's requests whichever worker answers
    the scrape: prometheus_client's multiprocess mode, where each process keeps its counts in files
    under PROMETHEUS_MULTIPROC_DIR and a scrape sums them. Set here, in the master before it forks,
    since prometheus_client picks its mode when first imported (in the workers, on first count).
    One worker keeps its counts in memory as a function instance does. None: nothing to clean up."""
    if workers == 1:
        return None
    path = tempfile.mkdtemp(prefix="devpilot-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


class PortInUse(Exception):
    """Something listens on the port already (another `devpilot serve`, say): nothing was started."""


def serve(host: str = "127.0.0.1", port: int = 8080, sweep_every: float = 30.0) -> int:
    """Serve until SIGINT or SIGTERM; the exit status. PortInUse before anything starts."""
    try:  # first: a port in use stops start-up before the database is touched
        listener = listen(host, port, BACKLOG)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise PortInUse(
            f"port {port} on {host} is in use (another devpilot serve?): stop it, or give --port"
        ) from None
    try:
        return _serve(listener, host, sweep_every)
    finally:
        listener.close()


def _serve(listener: socket.socket, host: str, sweep_every: float) -> int:
    port = int(listener.getsockname()[1])
    setup_logging(batched=True)
    settings = get_settings()
    database = resolve(settings.database_url)
    kept: list[local_secrets.Kept] = []
    if database.embedded:  # a developer's machine: what is unset is generated once under ./.devpilot/
        settings, kept = local_secrets.fill(settings)
    applied = migrate(database.url)
    url = f"http://{host}:{port}"
    stop = threading.Event()
    made: list[runtime.Runtime] = []
    workers = settings.serve_workers
    taken = multiprocessing.get_context("fork").Value("i", 0)
    metrics_dir = _shared_metrics(workers)

    def start_worker() -> None:
        with taken.get_lock():
            number, taken.value = taken.value, taken.value + 1
        pool = open_pool(database.url, settings)
        wakeups = Wakeups(settings.database_listen_url or database.url)
        made.append(runtime.Runtime(settings, database, pool, wakeups))
        runtime.install(made[0])
        wakeups.start()
        made[0].health.start()  # /healthz's own connection, ready before the first probe

        def sweeper() -> None:
            while not stop.wait(sweep_every):
                try:
                    r = run_sweep()  # counted in /metrics like a scheduled sweep
                    if r["requeued"] or r["deadLettered"]:
                        log.info(json.dumps({"event": "sweep", **r}))
                except Exception as exc:  # the next round retries; the table keeps the truth
                    log.warning("sweep failed: %s", exc)

        if number != _FIRST:
            return
        if sweep_every > 0:
            threading.Thread(target=sweeper, name="devpilot-sweep", daemon=True).start()
        # Said once the worker can answer, so whoever reads "serving on" may call at once: Granian's
        # worker binds its own socket only after this factory returns, so wait for it to listen.
        threading.Thread(target=announce, name="devpilot-announce", daemon=True).start()

    def announce() -> None:
        _wait_listening(host, port)
        print(f"devpilot serving on {url}", flush=True)
        print(
            f"database: {database.describe()}"
            + (" (embedded; set DATABASE_URL to use your own)" if database.embedded else ""),
            flush=True,
        )
        if applied:
            print(f"migrations applied: {', '.join(applied)}", flush=True)
        for line in configuration_report(settings, kept):
            print(line, flush=True)
        if workers > 1:
            print(f"workers: {workers}", flush=True)
        print(f"sweep: every {sweep_every:g}s" if sweep_every > 0 else "sweep: off", flush=True)

    def stop_worker() -> None:
        stop.set()
        try:
            for rt in made:
                rt.wakeups.stop()
                rt.health.close()
                rt.pool.close()
        finally:
            flush_logs()  # (the worker leaves through os._exit: logging's own flush at exit never runs)

    def drop_metrics() -> None:  # by the master as it stops; by its workers if it was SIGKILLed
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)

    _worker.update(start=start_worker, stop=stop_worker, orphaned=drop_metrics)
    _master["pid"] = os.getpid()
    server = SignalSafeServer(
        "devpilot.serve:worker_app",
        listener=listener,
        address=host,
        port=port,
        backlog=BACKLOG,
        interface=Interfaces.WSGI,
        factory=True,
        workers=workers,
        blocking_threads=THREADS,
        backpressure=THREADS * 2,
        http=HTTPModes.http1,
        http1_settings=HTTP1Settings(header_read_timeout=int(HEADER_DEADLINE * 1000)),
        workers_kill_timeout=GRACEFUL_SECONDS,
        log_enabled=False,
    )
    # The worker is forked on every POSIX system (Python's default elsewhere than Linux is to spawn
    # a fresh interpreter, which would not inherit what serve() set up).
    multiprocessing.set_start_method("fork", force=True)
    master = os.getpid()
    try:
        server.serve()
    except SystemExit as exc:  # Granian's master ends with sys.exit when a worker failed
        code = exc.code if isinstance(exc.code, int) else 0
    else:
        code = 0
    finally:
        # The forked worker unwinds through here too when it exits; only the master owns the
        # embedded database and says it stopped.
        if os.getpid() == master:
            drop_metrics()
            if database.embedded and database.handle is not None:
                database.handle.cleanup()
            print("devpilot stopped", flush=True)
    return code
