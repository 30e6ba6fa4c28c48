"""Connections and the transaction handle that the queue's write paths require.

`Tx` can only be made by `transaction()`, and only while its block is open. Functions that must
run inside the caller's transaction (`enqueue_dispatch`, `cancel_issue`, ...) take a `Tx` as their
first argument: a `psycopg.Connection`, a pool or `None` is a mypy error, and at run time
`require_tx` refuses them (and an ended `Tx`) with TypeError before anything is written.
"""

from __future__ import annotations

import select
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from shared.settings import Settings
from shared.sql import query

Conn = psycopg.Connection[DictRow]
Pool = ConnectionPool[Conn]


class Tx:
    """An open transaction on one connection. Made only by `transaction()` or `statement()`; dead
    once it ends."""

    __slots__ = ("_active", "_conn", "_single")

    def __init__(self, conn: Conn, _token: object, *, single: bool = False) -> None:
        if _token is not _MINT:
            raise TypeError("Tx is made by shared.db.transaction(), not constructed directly")
        self._conn = conn
        self._active = True
        self._single = single  # `statement()`: the transaction is its one statement

    @property
    def active(self) -> bool:
        if self._single:
            return self._active
        return self._active and self._conn.info.transaction_status == TransactionStatus.INTRANS

    @property
    def conn(self) -> Conn:
        if not self._active:
            raise TypeError(
                "this transaction has ended (its block, or its one statement); open a new one with "
                "shared.db.transaction() or statement()"
            )
        return self._conn

    def execute(
        self, query: LiteralString | sql.SQL | sql.Composed, params: dict[str, Any] | None = None
    ) -> psycopg.Cursor[DictRow]:
        conn = self.conn
        if self._single:  # its one statement is the whole transaction: a second is refused above
            self._active = False
        return conn.execute(query, params)

    def one(self, query: LiteralString, params: dict[str, Any] | None = None) -> DictRow | None:
        return self.execute(query, params).fetchone()

    def all(self, query: LiteralString, params: dict[str, Any] | None = None) -> list[DictRow]:
        return self.execute(query, params).fetchall()


_MINT = object()
_POOL_SETTINGS: weakref.WeakKeyDictionary[Pool, Settings] = weakref.WeakKeyDictionary()


def require_tx(tx: object, caller: str) -> Tx:
    """Run-time half of the type guarantee: an open `Tx` or TypeError, before any write."""
    if not isinstance(tx, Tx):
        raise TypeError(
            f"{caller}() needs an open transaction from shared.db.transaction() as its first "
            f"argument, not {type(tx).__name__}: the session row and the queue row must commit together"
        )
    if not tx.active:
        raise TypeError(
            f"{caller}() was given a transaction that has ended (its block, or its one statement)"
        )
    return tx


@contextmanager
def lend(pool: Pool) -> Iterator[Conn]:
    """A pooled connection for one block, then back to the pool.

    psycopg_pool's `connection()` also ends the connection's transaction on the way out (commit, or
    rollback on an exception): a call into the driver on every request that never has anything to
    end here, since every pooled connection is autocommit and every transaction an explicit
    `transaction()` block, ended by that block. A connection handed back otherwise (broken, or
    mid-transaction) is rolled back or replaced by the pool's `putconn`, as with `connection()`.
    """
    conn = pool.getconn()
    try:
        yield conn
    finally:
        pool.putconn(conn)


@contextmanager
def transaction(source: Pool | Conn) -> Iterator[Tx]:
    """Open a transaction: commits when the block ends normally, rolls back on an exception.

    Behind a transaction-mode pooler session settings do not stick, so on a pool opened for one
    (DEVPILOT_TRANSACTION_POOLER) the statement timeout is set per transaction instead.
    """
    if isinstance(source, ConnectionPool):
        with lend(source) as conn, _open(conn, _POOL_SETTINGS.get(source)) as tx:
            yield tx
    else:
        with _open(source, None) as tx:
            yield tx


@contextmanager
def statement(pool: Pool) -> Iterator[Tx]:
    """A transaction of exactly one statement, for a write whose statement does all of it.

    Postgres runs a statement sent on an autocommit connection as a transaction of its own: all of
    it commits when it ends, or none of it (deferred constraint triggers run then too). That is
    two round trips fewer than a `transaction()` block (no BEGIN, no COMMIT). The `Tx` refuses a
    second statement (TypeError), so what must be atomic cannot be split across two by mistake.
    Behind a transaction-mode pooler the statement runs inside a `transaction()` block instead,
    where the statement timeout is set (`_open`).
    """
    settings = _POOL_SETTINGS.get(pool)
    with lend(pool) as conn:
        if settings is not None and settings.database_transaction_pooler:
            with _open(conn, settings, single=True) as tx:
                yield tx
            return
        tx = Tx(conn, _MINT, single=True)
        try:
            yield tx
        finally:
            tx._active = False


@contextmanager
def _open(conn: Conn, settings: Settings | None, *, single: bool = False) -> Iterator[Tx]:
    with conn.transaction():
        tx = Tx(conn, _MINT, single=single)
        try:
            if settings is not None and settings.database_transaction_pooler:
                conn.execute(query("set_local_timeout"), {"ms": settings.statement_timeout_ms})
            yield tx
        finally:
            tx._active = False


def take_in_rounds(
    pool: Pool,
    statement_name: str,
    params: dict[str, Any],
    handle: Callable[[list[DictRow]], list[str]],
    rounds: int = 20,
) -> None:
    """Take rows with a statement that leases due work (the outbox's `notice_take`, the router's
    `routing_take`) and `handle` them, round after round. Such work is in order per agent session:
    a row waits while an earlier one of its agent session is open. So after a round the statement
    is run again for just the agent sessions `handle` returns (whose next row may now be due) instead
    of leaving it to the sweep; it stops when a round takes nothing or names no agent session."""
    follow: list[str] | None = None
    for _ in range(rounds):
        with lend(pool) as conn:
            rows = conn.execute(query(statement_name), {**params, "agent_sessions": follow}).fetchall()
        if not rows:
            return
        follow = handle(rows)
        if not follow:
            return


def check_on_checkout(conn: Conn) -> None:
    """The pool's check before lending a connection, without a round trip in the usual case.

    An idle pooled connection is sent nothing unasked (none of them LISTENs), so a socket with
    something to read means the server spoke first: the goodbye of a terminated backend, a restart,
    a pooler closing. Only then is the connection pinged (psycopg_pool's own check), and a dead one
    is replaced before any request sees it. A ping on every checkout would be one more round trip
    per statement, on every request, for the rare case this already catches.
    """
    if conn.closed:  # (a broken connection is closed too)
        raise psycopg.OperationalError("connection is closed")
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


def connect(url: str, *, autocommit: bool = True, pooler: bool = False) -> Conn:
    """One direct connection (migrations, LISTEN, tests)."""
    return psycopg.connect(
        url, autocommit=autocommit, row_factory=dict_row, prepare_threshold=None if pooler else 5
    )


def open_pool(url: str, settings: Settings, *, min_size: int = 1, max_size: int | None = None) -> Pool:
    """The pool every handler shares, opened explicitly (and waited on, so a bad URL fails here).

    Connections are autocommit so every transaction is an explicit `transaction()` block; a broken
    connection is detected on checkout (`check_on_checkout`) and replaced, so the pool recovers from
    a restart or a pg_terminate_backend by itself.
    """
    kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
    if settings.database_transaction_pooler:
        kwargs["prepare_threshold"] = None  # PgBouncer/Supavisor transaction mode: no prepared statements

    def configure(conn: Conn) -> None:
        if not settings.database_transaction_pooler:
            conn.execute(query("set_session_timeouts"), {"ms": settings.statement_timeout_ms})

    pool: Pool = ConnectionPool(
        url,
        connection_class=psycopg.Connection[DictRow],
        kwargs=kwargs,
        min_size=min_size,
        max_size=max_size or settings.database_pool_max,
        configure=configure,
        check=check_on_checkout,
        timeout=10.0,
        open=False,
        name="devpilot",
    )
    _POOL_SETTINGS[pool] = settings
    try:
        pool.open(wait=True, timeout=settings.connect_timeout_seconds)
    except BaseException:
        pool.close()  # stop its connector threads; the next request tries afresh
        raise
    return pool
