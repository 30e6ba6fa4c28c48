"""Connections and the transaction handle that the queue's write paths require.

`Tx` can only be made by `transaction()`, and only while its block is open. Functions that must
run inside the caller's transaction (`enqueue_dispatch`, `change_issues`, ...) take a `Tx` as their
first argument: a `psycopg.Connection`, a pool or `None` is a mypy error, and at run time
`require_tx` refuses them (and an ended `Tx`) with TypeError before anything is written.

Every connection lent from the pool is bounded by a deadline (`lend`, `shared.plumbing.deadline`,
`shared.plumbing.watchdog`): when the database does not answer, the caller hears OperationalError in time.
"""

from __future__ import annotations

import json
import select
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from time import monotonic
from typing import Any, LiteralString, Self, cast

import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from shared.plumbing import deadline
from shared.plumbing.settings import Settings
from shared.plumbing.sql import query
from shared.plumbing.watchdog import WATCHDOG

Conn = psycopg.Connection[DictRow]


_JSON = json.JSONDecoder()


class JsonbLoader(Loader):
    """`jsonb` parsed straight from the text Postgres sends: psycopg's own loader copies the buffer
    to bytes and has `json.loads` detect its encoding first, about twice the time per value (each
    claimed message's payload is one). The same values: `json.loads` on the same text. (It reads
    no `psycopg.types.json.set_json_loads`: nothing here sets one.)"""

    def load(self, data: Buffer) -> Any:
        return _JSON.decode(str(data, "utf-8"))


def jsonb_once(value: Any) -> Jsonb:
    """A `jsonb` parameter that several statements of one transaction are sent (a batch's
    elements): encoded to JSON here, once, where psycopg encodes a `Jsonb` again for each statement
    it is bound to."""
    data = json.dumps(value).encode()
    return Jsonb(value, dumps=lambda _value: data)


class Connection(psycopg.Connection[DictRow]):
    """psycopg's connection, less one leak: an attempt to connect that fails (a timeout above all)
    keeps its socket open until Python's cyclic garbage collector happens to run, because the error
    raised holds the frames that hold the attempt (psycopg issue #565 is the same family). In an
    outage the pool's workers try again every few seconds, and the sockets piled up past the pool's
    bound (tests/test_db_faults.py's minute-long stall counted 19 against 12). Dropping the
    tracebacks of the error's chain frees the attempt, and closes its socket, at once. Its `jsonb`
    is read by `JsonbLoader`."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        try:
            conn = super().connect(conninfo, **kwargs)
        except psycopg.Error as exc:
            seen: set[int] = set()
            link: BaseException | None = exc
            while link is not None and id(link) not in seen:
                seen.add(id(link))
                link.__traceback__ = None
                link = link.__context__ or link.__cause__
            raise
        conn.adapters.register_loader("jsonb", JsonbLoader)
        return conn


def usable(conn: Conn, until: float) -> bool:
    """Whether a pooled connection may be lent, without a round trip in the usual case.

    An idle pooled connection is sent nothing unasked (none of them LISTENs), so a socket with
    something to read means the server spoke first: the goodbye of a terminated backend, a restart,
    a pooler closing. Only then is the connection pinged (psycopg_pool's own check), within the
    caller's deadline. A ping on every checkout would be one more round trip per statement, on
    every request, for the rare case this already catches.
    """
    if conn.closed:  # (a broken connection is closed too)
        return False
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if not poller.poll(0):
        return True
    try:
        with WATCHDOG.watching(conn, until) as watch:
            ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return False
    return not watch.cut


class Pool(ConnectionPool[Conn]):
    """psycopg_pool's pool, whose check before lending a connection makes no pause.

    psycopg_pool's own `check` sleeps between two failed checks (1 s, then 2 s, ...), so after a
    restart or a `pg_terminate_backend`, with every idle connection dead, a request found a dead
    one, slept a second, found the next, slept two: it reached its deadline and answered 503 while
    fresh connections were ready. Here a dead connection is thrown away at once (the pool opens
    another) and the next one looked at; when none is left, `getconn` waits for a new one within
    the same timeout. (`connection()` goes through here too.)
    """

    def getconn(self, timeout: float | None = None) -> Conn:
        until = monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            conn = super().getconn(timeout=until - monotonic())
            if usable(conn, until):
                return conn
            conn.close()
            self.putconn(conn)


class Tx:
    """An open transaction on one connection. Made only by `transaction()` or `statement()`; dead
    once it ends."""

    __slots__ = ("_active", "_conn", "_single", "_together")

    def __init__(self, conn: Conn, _token: object, *, single: bool = False, together: bool = False) -> None:
        if _token is not _MINT:
            raise TypeError("Tx is made by shared.plumbing.db.transaction(), not constructed directly")
        self._conn = conn
        self._active = True
        self._single = single  # `statement()`: the transaction is its one statement
        self._together = together  # `together()`: its statements sent in a pipeline

    @property
    def active(self) -> bool:
        if self._single or self._together:  # (in a pipeline the server reports no state until a sync)
            return self._active
        return self._active and self._conn.info.transaction_status == TransactionStatus.INTRANS

    @property
    def conn(self) -> Conn:
        if not self._active:
            raise TypeError(
                "this transaction has ended (its block, or its one statement); open a new one with "
                "shared.plumbing.db.transaction() or statement()"
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
            f"{caller}() needs an open transaction from shared.plumbing.db.transaction() as its first "
            f"argument, not {type(tx).__name__}: the session row and the queue row must commit together"
        )
    if not tx.active:
        raise TypeError(
            f"{caller}() was given a transaction that has ended (its block, or its one statement)"
        )
    return tx


@contextmanager
def lend(pool: Pool) -> Iterator[Conn]:
    """A pooled connection for one block, then back to the pool, within the current deadline.

    The deadline (`shared.plumbing.deadline`: the request's, or the pool's default for work no request
    bounds) covers the wait for a connection and every statement sent on it: the watchdog cuts the
    connection when it passes (`shared.plumbing.watchdog`), and the block's statement fails with
    OperationalError at once, whatever the server does. A connection that was cut, or that comes
    back mid-transaction (its block failed in a way that left the transaction open), is closed
    before the pool sees it: the server rolls back a transaction whose connection went away, where
    a rollback sent to a server that does not answer would hang; the pool replaces it.

    psycopg_pool's `connection()` also ends the connection's transaction on the way out (commit, or
    rollback on an exception): a call into the driver on every request that never has anything to
    end here, since every pooled connection is autocommit and every transaction an explicit
    `transaction()` block, ended by that block.
    """
    settings = _POOL_SETTINGS.get(pool)
    until = deadline.until(settings.sweep_deadline_seconds if settings else DEFAULT_DEADLINE_SECONDS)
    left = until - monotonic()
    if left <= 0:
        raise deadline.Passed("the request's deadline for the database passed before it was asked")
    conn = pool.getconn(timeout=left)
    try:
        watch = WATCHDOG.watch(conn, until)
    except BaseException:
        pool.putconn(conn)
        raise
    try:
        yield conn
    finally:
        cut = WATCHDOG.release(watch)
        if cut or conn.pgconn.transaction_status != TransactionStatus.IDLE:
            conn.close()  # (the pool discards a closed connection and opens another)
        pool.putconn(conn)


@contextmanager
def transaction(source: Pool | Conn) -> Iterator[Tx]:
    """Open a transaction: commits when the block ends normally, rolls back on an exception.

    Behind a transaction-mode pooler session settings do not stick, so on a pool opened for one
    (DEVPILOT_TRANSACTION_POOLER) the server-side settings are set per transaction instead.
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
    where the server-side settings are set (`_open`).
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
def together(pool: Pool) -> Iterator[Tx]:
    """A transaction whose statements are sent as they are given, and waited for only when one's
    rows are read (psycopg's pipeline mode): BEGIN goes with the first statement, and COMMIT with
    the statements after the last read, so a transaction whose later statements depend on the
    earlier ones in SQL alone (not on a decision made here between them) is one round trip, and each
    read before the commit one more. (psycopg's own `transaction()` in a pipeline waits for BEGIN,
    and for the statements before COMMIT, each on its own round trip.) Rows are read from a
    statement's cursor (`Tx.execute`), also after the block. Commits when the block ends normally;
    on an exception, or a statement that failed, nothing is committed (rolled back)."""
    settings = _POOL_SETTINGS.get(pool)
    with lend(pool) as conn:
        tx = Tx(conn, _MINT, together=True)
        try:
            with conn.pipeline():  # (its end sends what is left, COMMIT too, and waits for it all)
                conn.execute("BEGIN")
                if settings is not None and settings.database_transaction_pooler:
                    conn.execute(query("set_local_settings"), _limits(settings))
                yield tx
                tx._active = False
                conn.execute("COMMIT")
        except BaseException:
            tx._active = False
            _roll_back(conn)
            raise


def _roll_back(conn: Conn) -> None:
    """End a transaction `together` left open (a statement failed, or its block raised). A
    connection that cannot is left to `lend`, which closes it: the server rolls back a transaction
    whose connection went away."""
    if conn.closed or conn.pgconn.transaction_status not in (
        TransactionStatus.INTRANS,
        TransactionStatus.INERROR,
    ):
        return
    with suppress(psycopg.Error):
        conn.execute("ROLLBACK")


@contextmanager
def _open(conn: Conn, settings: Settings | None, *, single: bool = False) -> Iterator[Tx]:
    with conn.transaction():
        tx = Tx(conn, _MINT, single=single)
        try:
            if settings is not None and settings.database_transaction_pooler:
                conn.execute(query("set_local_settings"), _limits(settings))
            yield tx
        finally:
            tx._active = False


def take_in_rounds(
    pool: Pool,
    statement_name: str,
    params: dict[str, Any],
    handle: Callable[[list[DictRow]], list[str]],
    rounds: int = 20,
    *,
    first: str | None = None,
) -> None:
    """Take rows with a statement that leases due work (the outbox's `notice_take`, the router's
    `routing_take`) and `handle` them, round after round. Such work is in order per agent session:
    a row waits while an earlier one of its agent session is open. So after a round the statement
    is run again for just the agent sessions `handle` returns (whose next row may now be due) instead
    of leaving it to the sweep; it stops when a round takes nothing or names no agent session.
    `first`: the first round's statement, when it is another (the outbox's sweep: any due post).
    Each round is one statement (`statement`: behind a transaction pooler, with the server-side
    settings of `_open`, so a take is bound by the limits there too, and never compiled)."""
    follow: list[str] | None = None
    name = first or statement_name
    for _ in range(rounds):
        with statement(pool) as tx:
            rows = tx.all(query(name), {**params, "agent_sessions": follow})
        name = statement_name
        if not rows:
            return
        follow = handle(rows)
        if not follow:
            return


def _limits(settings: Settings) -> dict[str, int]:
    return {
        "statement_ms": settings.statement_timeout_ms,
        "lock_ms": settings.lock_timeout_ms,
        "idle_ms": settings.idle_in_transaction_timeout_ms,
    }


def connect(url: str, *, autocommit: bool = True, pooler: bool = False) -> Conn:
    """One direct connection (migrations, LISTEN, tests)."""
    return Connection.connect(
        url, autocommit=autocommit, row_factory=dict_row, prepare_threshold=None if pooler else 5
    )


# How long the pool keeps retrying to open one connection before it gives that slot up (and opens
# one afresh when a request next waits). psycopg_pool doubles its delay between attempts without a
# cap (1, 2, 4, 8 ... s) for five minutes by default: after a long outage its next attempt could
# come minutes after the database is back. Ten seconds keep the delay under five.
RECONNECT_SECONDS = 10.0
DEFAULT_DEADLINE_SECONDS = 30.0  # a pool opened without settings (never, in the service)


def session_options(url: str, settings: Settings) -> str:
    """The server-side settings for every session of the pool, sent in the startup packet (libpq's
    `options`): no round trip of their own, and in force before the first statement. Appended to
    any `options` the URL already has.

    The limits, and no JIT compilation: Postgres compiles a statement whose estimated cost passes
    `jit_above_cost`, and a statement of ours that runs in milliseconds can be estimated that high
    over a big table (the outbox's take beside many waiting posts), and then the compiling takes
    far longer than the running (bench/README.md). The service's statements are short; none gains
    from it."""
    given = str(conninfo_to_dict(url).get("options") or "")
    ours = (
        f"-c statement_timeout={settings.statement_timeout_ms} "
        f"-c lock_timeout={settings.lock_timeout_ms} "
        f"-c idle_in_transaction_session_timeout={settings.idle_in_transaction_timeout_ms} "
        "-c jit=off"
    )
    return f"{given} {ours}".strip()


def open_pool(
    url: str, settings: Settings, *, min_size: int = 1, max_size: int | None = None, wait: bool = True
) -> Pool:
    """The pool every handler shares, opened explicitly (and waited on, so a bad URL fails here).
    `wait=False` (a function instance's first request): the pool connects in the background and
    the request waits for a connection within its own deadline, so a database that does not
    answer costs that request its deadline (503), not the connect timeout before any deadline.

    Connections are autocommit so every transaction is an explicit `transaction()` block; a broken
    connection is detected on checkout (`Pool.getconn`) and replaced, so the pool recovers from a
    restart or a pg_terminate_backend by itself. Opening a connection is bounded by
    DEVPILOT_DB_CONNECT_TIMEOUT_SECONDS (a server that accepts and never answers holds a pool
    worker that long, not for ever).
    """
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "row_factory": dict_row,
        "connect_timeout": max(2, round(settings.connect_timeout_seconds)),
    }
    if settings.database_transaction_pooler:
        # PgBouncer/Supavisor transaction mode: no prepared statements, and no session settings
        # (the limits, and JIT off, are set per transaction instead, `_open`).
        kwargs["prepare_threshold"] = None
    else:
        kwargs["options"] = session_options(url, settings)

    pool = Pool(
        url,
        connection_class=cast(type[Conn], Connection),
        kwargs=kwargs,
        min_size=min_size,
        max_size=max_size or settings.database_pool_max,
        timeout=10.0,  # (what `pool.connection()` waits; the service's `lend()` waits its deadline)
        reconnect_timeout=RECONNECT_SECONDS,
        open=False,
        name="devpilot",
    )
    _POOL_SETTINGS[pool] = settings
    try:
        pool.open(wait=wait, timeout=settings.connect_timeout_seconds)
    except BaseException:
        pool.close()  # stop its connector threads; the next request tries afresh
        raise
    return pool
