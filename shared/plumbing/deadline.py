"""The time by which the current request's database work must end.

A request (or the sweep) sets its deadline once, `bound(seconds)`; every database block it opens
(`shared.plumbing.db.lend`: waiting for a pooled connection, then each statement on it) shares it, so the
request as a whole answers within it: past it, `Passed` (or the connection cut by the watchdog,
`shared.plumbing.watchdog`) reaches the route as a psycopg OperationalError and the caller hears
`503 db_unavailable`. Work that no request bounds (the Linear posts after a commit, the CLI, the
tests) gives each of its blocks the pool's default instead.

A context variable, so each request thread (and each asyncio task, should one ever use it) has its
own; a thread pool's workers do not inherit it, and so fall back to that default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from time import monotonic

import psycopg

_until: ContextVar[float | None] = ContextVar("devpilot_db_deadline", default=None)


class Passed(psycopg.OperationalError):
    """The deadline passed before the database work could start: nothing was sent."""


@contextmanager
def bound(seconds: float | None) -> Iterator[None]:
    """The database work in this block ends within `seconds` from now. None: no deadline for the
    block as a whole (each database block in it gets its pool's default)."""
    token = _until.set(None if seconds is None else monotonic() + seconds)
    try:
        yield
    finally:
        _until.reset(token)


@contextmanager
def extended(seconds: float) -> Iterator[None]:
    """The current deadline, `seconds` later for this block (a long-poll waits, then claims)."""
    current = _until.get()
    token = _until.set(None if current is None else current + seconds)
    try:
        yield
    finally:
        _until.reset(token)


def until(default_seconds: float) -> float:
    """The monotonic time the current database block must end by: the request's deadline, or
    `default_seconds` from now where no request set one."""
    current = _until.get()
    return monotonic() + default_seconds if current is None else current
