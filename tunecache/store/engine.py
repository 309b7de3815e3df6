"""Engines for SQLite on shared filesystems and for PostgreSQL, the one transaction helper
(:meth:`Database.run`), and the two transaction bodies that run any one statement.

SQLite notes (https://www.sqlite.org/lockingv3.html, https://www.sqlite.org/wal.html):
- WAL keeps its index in shared memory, which does not work across the hosts of a network
  filesystem, so the journal is a rollback journal (TRUNCATE: like DELETE, one directory
  operation fewer per commit).
- A deferred transaction that later writes can get SQLITE_BUSY without the busy handler ever
  waiting (the deadlock SQLite avoids by failing). Every write transaction therefore starts
  with BEGIN IMMEDIATE. Python's sqlite3 module issues its own BEGIN, so we switch that off
  and emit ours: SQLAlchemy's documented recipe ("Serializable isolation / Savepoints /
  Transactional DDL" in the pysqlite dialect docs).
- synchronous=FULL: a host that loses power must not leave a torn entry behind.

PostgreSQL notes (https://www.postgresql.org/docs/15/runtime-config-client.html):
- Every session bounds its waits by the lock timeout: ``lock_timeout``, a ``statement_timeout``
  above it (a stalled server), and ``idle_in_transaction_session_timeout`` at half of it, so
  that the server itself ends the transaction of a client frozen mid-claim (SIGSTOP, a
  debugger) before the peers queued on its row lock give up. They are set
  on connect, not as startup ``options``, in which PgBouncer refuses them.
- A connection is held only while a process works: it is kept after a transaction only
  until the next one, if that comes within _PG_IDLE_SECONDS (a burst of lookups), and then
  closed by a thread; a process that had to wait for a slot gives its connection back at
  once. Ranks and compile workers that each kept one for their life exhausted
  ``max_connections`` at cluster scale; a refused connection ("too many clients", a
  CONNECTION LIMIT) is waited out like a lock, within the lock timeout.

Engines do not survive fork(): the pool's sockets and file handles would be shared with the
parent. :class:`Database` notices a new pid and builds a fresh engine in the child.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import make_url

from ..errors import StoreError, StoreTimeoutError, StoreUnavailableError

__all__ = ["Database", "rows", "scalar"]

logger = logging.getLogger("tunecache")

T = TypeVar("T")

# Errors that mean "try again shortly" rather than "the database is gone".
_SQLITE_RETRY = ("database is locked", "database table is locked", "database schema has changed")
_SQLITE_BUSY_SECONDS = 0.05
_MAX_RETRY_DELAY = 0.02
_PG_RETRY_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock_not_available
# A connection refused for want of a slot (SQLSTATE 53300): max_connections, the slots
# reserved for superusers, or a database's or role's CONNECTION LIMIT. psycopg reports a
# failed connect without a SQLSTATE, so the server's messages are matched too
# (src/backend/postmaster/postmaster.c, src/backend/utils/init/postinit.c).
_PG_FULL_MESSAGES = ("too many clients", "too many connections", "connection slots are reserved")
# A server that restarts (or a backend that an operator ends) refuses or drops connections
# for a second or two: admin_shutdown, crash_shutdown, cannot_connect_now, and their
# messages for a failed connect, which carries no SQLSTATE. Waited out within the lock
# timeout like a lock, or every process that touched the database then tuned locally for
# the rest of its job (tools/soak.py: 213-291 local results in 2 minutes with a restart
# every 40 s). A refused or dropped connection counts only once this process has reached
# the server: a database that was never up is unreachable, and says so at once.
_PG_RESTART_SQLSTATES = {"57P01", "57P02", "57P03"}
_PG_RESTART_MESSAGES = ("the database system is starting up",
                        "the database system is shutting down",
                        "the database system is not yet accepting connections",
                        "the database system is in recovery mode",
                        "terminating connection due to administrator command")
_PG_GONE_MESSAGES = ("connection refused", "server closed the connection unexpectedly",
                     "connection is closed", "consuming input failed")
# Every refused connect costs the server a fork: retry those less eagerly than lock waits,
# and at one steady, jittered pace, since with a backoff that grows, newcomers' quick
# retries took the freed slots from the processes that had waited longest. 40 processes on
# 8 slots, 2 loaded cores, a connection per transaction: the slowest transaction took
# 9-14 s with the backoff, 4-8 s at this pace, which also halved the refused connects.
_CONNECT_RETRY_SECONDS = 0.25
# A connection idle this long is closed. A connect costs 2-8 ms (fork of a backend,
# settings; PostgreSQL 15), 20x a lookup on an open connection; kept through a burst, it
# costs at most a few % of the time between two transactions further apart than this.
_PG_IDLE_SECONDS = 0.1
# After a refused connect, connections are closed at once for this long.
_CROWDED_SECONDS = 10.0


def _redacted(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


class Database:
    """An engine per process for one URL, and transactions with bounded retry."""

    def __init__(self, url: str, lock_timeout: float = 30.0, readonly: bool = False,
                 own_directory: bool = False) -> None:
        self.url = url
        # A SQLite file's directory is created only when it is tunecache's own (the
        # embedded default under the user's cache directory): any other missing directory
        # is a typo, and creating it would fill a database nobody else reads.
        self.own_directory = own_directory
        # Readonly is enforced by the database, not only by our code paths: SQLite opens
        # the file with mode=ro (never creating it), PostgreSQL sessions are read-only.
        self.readonly = readonly
        self.display_url = _redacted(url)
        self.lock_timeout = lock_timeout
        self.dialect = make_url(url).get_backend_name()
        self._engine: Engine | None = None
        self._idle: _IdleCloser | None = None
        self._crowded_until = 0.0
        self._reached = False  # a transaction of this process has completed on the server
        self._pid = -1
        self._lock = threading.Lock()

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def sqlite_path(self) -> str | None:
        return make_url(self.url).database if self.is_sqlite else None

    def sqlite_path_problem(self, hint: str = "TUNECACHE_DB") -> str | None:
        """Why the SQLite path cannot hold a database (a directory; a missing directory
        that is not our own), in words; None if it can (or this is not SQLite). SQLite
        itself only says "unable to open database file" or "disk I/O error"."""
        path = self.sqlite_path
        if not path:
            return None
        if os.path.isdir(path):
            return (f"this is a directory, not a database file; name a file in it, e.g. "
                    f"{os.path.join(path, 'tunecache.db')}")
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory) and not (self.own_directory and not self.readonly):
            return f"directory {directory} does not exist; check {hint}, or create it first"
        return None

    @property
    def engine(self) -> Engine:
        pid = os.getpid()
        if self._engine is None or self._pid != pid:
            with self._lock:
                if self._engine is None or self._pid != pid:
                    if self._engine is not None:
                        # Inherited from the parent: drop the pool without closing the
                        # parent's connections (SQLAlchemy's "Using Connection Pools with
                        # Multiprocessing" recipe).
                        self._engine.dispose(close=False)
                    self._engine = self._create_engine()
                    self._pid = pid
        return self._engine

    def _create_engine(self) -> Engine:
        if self.is_sqlite:
            path = self.sqlite_path or ""
            problem = self.sqlite_path_problem()
            if problem is not None:
                raise StoreUnavailableError(self.display_url, problem)
            if self.own_directory and not self.readonly:
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            # A small pool: reopening the file (and re-running the PRAGMAs) for every
            # transaction costs more than the transaction. Forks get a fresh engine.
            engine = create_engine(
                f"sqlite:///file:{path}?mode=ro&uri=true" if self.readonly else self.url,
                pool_size=2,
                max_overflow=4,
                connect_args={
                    # SQLite's own busy handler sleeps up to 100 ms at a time, so under
                    # contention a waiter can lose whole rounds to processes that just
                    # arrived (seen as unfair work splits with 16 processes). It waits at
                    # most _SQLITE_BUSY_SECONDS; run() retries in finer, jittered steps
                    # until lock_timeout.
                    "timeout": min(self.lock_timeout, _SQLITE_BUSY_SECONDS),
                    "isolation_level": None,
                    "check_same_thread": False,
                },
            )
            event.listen(engine, "connect", _sqlite_on_connect)
            event.listen(engine, "begin", _sqlite_on_begin)
            return engine
        engine = create_engine(
            self.url,
            # One connection kept between transactions, closed when idle; threads of a
            # process that run transactions at once each open their own, never wait.
            pool_size=1,
            max_overflow=-1,
            connect_args={
                "connect_timeout": max(1, int(min(self.lock_timeout, 10))),
                "application_name": "tunecache",
            },
        )
        event.listen(engine, "connect", self._pg_on_connect)
        self._idle = _IdleCloser(engine)
        return engine

    def _pg_on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        # One round trip. Session settings outlive only a committed transaction, so this
        # runs in autocommit (SQLAlchemy's "Setting a Default Schema for New Connections"
        # recipe). PostgreSQL reads 0 ms as "no timeout": hence at least 1.
        ms = max(1, round(self.lock_timeout * 1000))
        settings = {
            "lock_timeout": ms,
            "statement_timeout": 2 * ms,  # above lock_timeout, or lock_timeout never fires
            "idle_in_transaction_session_timeout": max(1, ms // 2),
        }
        sql = "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in settings)
        params = [v for name, value in settings.items() for v in (name, str(value))]
        if self.readonly:
            sql += ", set_config('default_transaction_read_only', 'on', false)"
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            dbapi_connection.execute(sql, params)
        finally:
            dbapi_connection.autocommit = autocommit

    def dispose(self) -> None:
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
        self._engine = None
        if self._idle is not None:
            self._idle.stop()
        self._idle = None

    @contextmanager
    def _connection(self, write: bool) -> Iterator[Connection]:
        conn = self.engine.connect()
        try:
            if write and self.is_sqlite:
                conn = conn.execution_options(sqlite_begin="IMMEDIATE")
            elif not write:
                # A read is one statement, atomic on its own: no BEGIN/COMMIT round trips.
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn
        finally:
            conn.close()
            if self._idle is not None:
                if time.monotonic() < self._crowded_until:
                    self.engine.pool.dispose()  # closes the idle connection, now
                else:
                    self._idle.used()

    def run(self, work: Callable[[Connection], T], *, write: bool = False) -> T:
        """Run ``work(conn)`` in one transaction, committed on return, rolled back on error.

        ``write=False`` promises that ``work`` runs a single read statement (it then runs in
        autocommit). Busy/locked errors are retried with jittered backoff until
        ``lock_timeout``, then :class:`StoreTimeoutError`; a pooled connection found dead
        (server restarted) is replaced once. Every other driver error becomes a
        :class:`StoreError` (:class:`StoreUnavailableError` when the database cannot be
        reached or read).
        """
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.001
        reconnected = False
        while True:
            try:
                with self._connection(write) as conn, conn.begin():
                    result = work(conn)
                self._reached = True
                return result
            except exc.DBAPIError as e:
                # No pre-ping (a round trip per checkout): a connection the server dropped
                # (restarted, or ended an idle transaction) is noticed on use, and the
                # whole transaction is simply run again.
                if e.connection_invalidated and not reconnected:
                    reconnected = True
                    continue
                full = self._server_full(e)
                if full:
                    self._crowded_until = time.monotonic() + _CROWDED_SECONDS
                restarting = not full and self._server_restarting(e)
                if not (full or restarting or self._retryable(e)):
                    raise self._translate(e) from e
                left = deadline - time.monotonic()
                if left <= 0:
                    if restarting:
                        raise StoreUnavailableError(
                            self.display_url,
                            f"the server went away and was not back within "
                            f"{self.lock_timeout:g}s ({self._translate(e).reason})",
                        ) from e
                    raise StoreTimeoutError(
                        self.display_url,
                        f"no free connection slot after {self.lock_timeout:g}s (raise the "
                        "server's limits or TUNECACHE_LOCK_TIMEOUT; see the README's "
                        "'PostgreSQL for a cluster')"
                        if full else
                        f"still locked after {self.lock_timeout:g}s "
                        "(raise TUNECACHE_LOCK_TIMEOUT, or look for a stuck process)",
                    ) from e
                if full or restarting:
                    pause = _CONNECT_RETRY_SECONDS * (0.5 + random.random())
                else:
                    pause = delay * (0.5 + random.random())
                    delay = min(delay * 2, _MAX_RETRY_DELAY)
                time.sleep(min(left, pause))
            except exc.SQLAlchemyError as e:
                raise StoreError(self.display_url, f"{type(e).__name__}: {e}") from e

    def _retryable(self, e: exc.DBAPIError) -> bool:
        if self.is_sqlite:
            return isinstance(e.orig, sqlite3.OperationalError) and any(
                s in str(e.orig) for s in _SQLITE_RETRY
            )
        return getattr(e.orig, "sqlstate", None) in _PG_RETRY_SQLSTATES

    def _server_full(self, e: exc.DBAPIError) -> bool:
        if self.is_sqlite:
            return False
        return getattr(e.orig, "sqlstate", None) == "53300" or any(
            m in str(e.orig) for m in _PG_FULL_MESSAGES
        )

    def _server_restarting(self, e: exc.DBAPIError) -> bool:
        if self.is_sqlite:
            return False
        if getattr(e.orig, "sqlstate", None) in _PG_RESTART_SQLSTATES:
            return True
        text = str(e.orig).lower()
        return any(m in text for m in _PG_RESTART_MESSAGES) or (
            self._reached and any(m in text for m in _PG_GONE_MESSAGES)
        )

    def _translate(self, e: exc.DBAPIError) -> StoreError:
        first_line = str(e.orig).strip().splitlines()[0] if str(e.orig).strip() else repr(e.orig)
        if isinstance(e, (exc.OperationalError, exc.InterfaceError)) or isinstance(
            e.orig, sqlite3.DatabaseError
        ):
            return StoreUnavailableError(self.display_url, first_line)
        return StoreError(self.display_url, first_line)


# Transaction bodies for a statement built elsewhere in the store (a count, a page of a
# listing or an export): tunecache.ops hands them to Database.run and never executes a
# statement itself.


def scalar(conn: Connection, statement: Any) -> Any:
    """The one value of ``statement`` (a count, a walk's end); None when it has no row."""
    return conn.execute(statement).scalar()


def rows(conn: Connection, statement: Any) -> list[Any]:
    """Every row of ``statement`` (a page of a listing or of an export)."""
    return list(conn.execute(statement).all())


class _IdleCloser:
    """Closes an engine's pooled connection once it has been idle _PG_IDLE_SECONDS."""

    def __init__(self, engine: Engine) -> None:
        self._engine = weakref.ref(engine)
        self._last_used = 0.0
        self._stopped = False
        self._used = threading.Event()
        threading.Thread(target=self._run, name="tunecache-idle-connection",
                         daemon=True).start()

    def used(self) -> None:
        """A connection was just returned to the pool."""
        self._last_used = time.monotonic()
        self._used.set()

    def stop(self) -> None:
        self._stopped = True
        self._used.set()

    def _run(self) -> None:
        # Wakes once per idle period, not per transaction; ends when stopped, or within a
        # minute of its engine becoming garbage (a Database never disposed).
        while not self._stopped:
            if not self._used.wait(timeout=60.0):
                if self._engine() is None:
                    return
                continue
            self._used.clear()
            while (idle := time.monotonic() - self._last_used) < _PG_IDLE_SECONDS:
                time.sleep(_PG_IDLE_SECONDS - idle)
            engine = self._engine()
            if engine is None:
                return
            engine.pool.dispose()  # closes idle connections only, never one in use
            del engine


def _decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _sqlite_on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
    # isolation_level=None (set in connect_args) stops pysqlite from emitting BEGIN itself.
    # SQLite keeps whatever bytes a writer cast to text; a strict decode would make every
    # read of a table fail at one such row, prunes included. Replaced characters leave the
    # row readable, and the validation of keys and timings refuses it as it would any other.
    dbapi_connection.text_factory = _decode_text
    cur = dbapi_connection.cursor()
    try:
        # Rollback-journal modes are per connection (only WAL persists in the file), so
        # every connection states its own.
        cur.execute("PRAGMA journal_mode=TRUNCATE")
        cur.execute("PRAGMA synchronous=FULL")
    finally:
        cur.close()


def _sqlite_on_begin(conn: Connection) -> None:
    options = conn.get_execution_options()
    if options.get("isolation_level") == "AUTOCOMMIT":
        return
    conn.exec_driver_sql(f"BEGIN {options.get('sqlite_begin', 'DEFERRED')}")
