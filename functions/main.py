"""Every functions-framework target, for `functions-framework --source functions/main.py --target X`
and Cloud Run's `--function X`: one per row of the route table (functions/routes.py), plus `api`,
which serves every route by path on one URL.

Targets are made on first access (PEP 562), so an instance imports only its own route's module.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

# functions-framework loads this file by path; make the repo root importable for `shared`.
_root = str(Path(__file__).resolve().parent.parent)
if _root not in sys.path:
    sys.path.insert(0, _root)

# What follows imports the target's chain (psycopg, the pool, this project's modules): objects that
# live as long as the process, nearly none of them garbage. The cyclic collector, left on, walked
# them again and again as they came, in passes that found nothing. Off until they are frozen below
# (as the gc module's documentation advises before a fork), then on again if it was.
# bench/README.md (Cold start).
_collecting = gc.isenabled()
gc.disable()
try:
    import flask

    from functions.app import Handler, serve_request, target
    from functions.logs import setup_logging
    from functions.routes import BY_NAME

    setup_logging()
finally:
    # What the target imported lives as long as the process: frozen out of the cyclic collector, so
    # the first full collection (which a first request's own imports can set off) walks only what
    # came after, not every module's objects, nor touches the pages a forked worker (gunicorn's, on
    # Cloud Run) shares with its parent. bench/README.md (Cold start).
    gc.freeze()
    if _collecting:
        gc.enable()


def api(request: flask.Request) -> flask.Response:
    """Every route by path, on one URL."""
    return serve_request(request)


def __getattr__(name: str) -> Handler:
    if name in BY_NAME:
        handler = target(name)
        globals()[name] = handler
        return handler
    raise AttributeError(name)


__all__ = ["api", *BY_NAME]
