"""The async SQLAlchemy engine for the central DB: which URLs work, which driver, which set-up.

A central URL is checked before any connection is tried, so a wrong one is a `ConfigError` that
names the setting and the way out, never a driver's own exception: an unsupported dialect, a
driver that is not installed, or an embedded SQLite file in a folder that does not exist. The
folder of the embedded default (``$AIRFLOW_HOME``) is created, as Airflow creates it.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from localstate._core.config import airflow_home
from localstate._core.setting_specs import DEFAULTS
from localstate.errors import ConfigError

__all__ = ["DEFAULT_TRANSACTION_TIMEOUT", "SUPPORTED_DIALECTS", "async_url", "make_engine",
           "read_connection"]

#: seconds (the `central_transaction_timeout` setting): the longest a central transaction of
#: this process waits for a row lock, or stays open with nothing to do, before the server ends
#: it. A writer frozen inside its flush (a stopped process, a paused VM, a long GC pause) holds
#: its row locks for at most this long, and a claim that meets them waits at most this long.
#: 10 s: well under Airflow's 30 s triggerer health-check threshold, so the locks of a
#: triggerer frozen mid-flush are gone before its triggers are even reassigned; well over a
#: flush's own time (a 10,000-row flush takes about 0.1 s), so no healthy flush is cut.
DEFAULT_TRANSACTION_TIMEOUT: Final[float] = DEFAULTS["central_transaction_timeout"]

#: dialect -> (its async driver, the Python module of that driver, the extra that installs it)
_DRIVERS: Final = {
    "sqlite": ("sqlite+aiosqlite", "aiosqlite", None),
    "postgresql": ("postgresql+asyncpg", "asyncpg", "postgres"),
    "mysql": ("mysql+aiomysql", "aiomysql", "mysql"),
}
SUPPORTED_DIALECTS: Final = tuple(_DRIVERS)

#: the asyncpg connection's and SQLAlchemy's prepared statement caches: off (unnamed
#: statements, what any pooler can carry) unless the central URL's query sets them, e.g.
#: ``?prepared_statement_cache_size=100&statement_cache_size=100``
_STATEMENT_CACHES: Final = ("statement_cache_size", "prepared_statement_cache_size")

#: the execution option that marks a connection as reading only (see `read_connection`)
_READ_ONLY: Final = "localstate_read_only"

#: marks a pool record whose connection was just made (`_ping_on_checkout`)
_FRESH: Final = "localstate_fresh"


def async_url(url: str) -> str:
    """`sqlite:///x.db` -> `sqlite+aiosqlite:///x.db`, `postgresql://` -> `+asyncpg`,
    `mysql://` -> `+aiomysql`.

    Raises `ConfigError` for a URL this store cannot use (see the module's docstring).
    """
    parsed = _checked(url)
    if "+" not in parsed.drivername:
        parsed = parsed.set(drivername=_DRIVERS[parsed.get_backend_name()][0])
    return parsed.render_as_string(hide_password=False)


def _checked(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(f"central_url {url!r} is not a database URL ({exc}); use e.g. "
                          "postgresql://user:password@host/airflow or sqlite:////path/to.db"
                          ) from None
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend not in _DRIVERS:
        raise ConfigError(
            f"central_url {shown}: the {backend!r} dialect is not supported as the central DB; "
            f"supported: {', '.join(SUPPORTED_DIALECTS)}"
        )
    driver = parsed.get_driver_name()
    _, module, extra = _DRIVERS[backend]
    if "+" in parsed.drivername and driver != module:
        raise ConfigError(
            f"central_url {shown}: the {driver!r} driver is not supported for {backend}; use "
            f"{backend}+{module}:// (or plain {backend}://)"
        )
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"central_url {shown} needs the {module} driver, which is not installed: "
            f"pip install 'localstate[{extra}]'"
        )
    if backend == "sqlite" and parsed.database and parsed.database != ":memory:":
        _require_folder(Path(parsed.database), shown)
    return parsed


def _require_folder(db_file: Path, shown: str) -> None:
    folder = db_file.expanduser().absolute().parent
    if folder.is_dir():
        return
    if folder == airflow_home().absolute():
        folder.mkdir(parents=True, exist_ok=True)  # $AIRFLOW_HOME, as Airflow creates it
        return
    raise ConfigError(
        f"central_url {shown}: the folder {folder} of the SQLite file does not exist; create "
        "it, or set central_url to a file in an existing folder"
    )


def make_engine(url: str, *,
                transaction_timeout: float | None = DEFAULT_TRANSACTION_TIMEOUT) -> AsyncEngine:
    """An async engine for the central DB, set up for this workload.

    `transaction_timeout` (seconds; None: no bound) is enforced by the server, per transaction:
    a lock waited for longer fails (a retryable `CentralUnavailable`), and a transaction left
    open and idle longer is ended by the server, its locks released. The process that left it
    learns so at its next statement (its connection is gone: retried, under the claim fence).
    SQLite, one file on one host, has no server to end another process's transaction.
    """
    full = async_url(url)
    parsed = make_url(full)
    if parsed.get_backend_name() == "sqlite":
        engine = create_async_engine(full, connect_args={"timeout": 30})
        _configure_sqlite(engine)
        return engine
    # pool_timeout: the bound too: a call that cannot get a connection within it is told so
    # (`CentralUnavailable`, retried) instead of queueing for a minute
    pool_timeout = 60.0 if transaction_timeout is None else transaction_timeout
    if parsed.get_backend_name() == "mysql":
        return _mysql_engine(full, transaction_timeout, pool_timeout)
    # Nothing a connection pooler can lose: no startup parameter (PgBouncer refuses unknown
    # ones), no session setting, no named prepared statement kept across transactions (under
    # transaction pooling the next transaction may run on another server connection). The
    # statements are prepared unnamed, inside their transaction, and the bounds are set per
    # transaction, in the round trip of its BEGIN (`_bound_postgres_transactions`). An unnamed
    # statement costs one round trip more than a cached one: where no pooler is in between (or
    # one that tracks named statements, PgBouncer >= 1.21 with max_prepared_statements), the
    # URL may turn the caches back on (`_STATEMENT_CACHES`). A connection taken from the pool
    # is checked first (`_ping_on_checkout`): a server restarted under us costs one failed
    # ping, not a failed flush.
    caches = {name: _cache_size(parsed, name) for name in _STATEMENT_CACHES}
    engine = create_async_engine(full, pool_size=5, max_overflow=5, pool_timeout=pool_timeout,
                                 connect_args={**caches,
                                               "connection_class": _bounded_connection()})
    _ping_on_checkout(engine)
    if transaction_timeout is not None:
        _bound_postgres_transactions(engine, max(1, round(transaction_timeout * 1000)))
    return engine


def _cache_size(url: URL, name: str) -> int:
    """The statement cache size `name` the central URL's query sets (0: none set)."""
    raw = url.query.get(name, "0")
    try:
        size = int(raw if isinstance(raw, str) else raw[-1])
    except ValueError:
        size = -1
    if size < 0:
        raise ConfigError(f"central_url: {name}={raw!r} is not a number of statements; use "
                          f"{name}=0 (the default, for any pooler) or e.g. {name}=100")
    return size


def _postgres_bounds_sql(ms: int) -> str:
    """The statement that sets the transaction bound for the current transaction only
    (``set_config(..., true)`` is ``SET LOCAL``)."""
    bounds = {
        # the frozen writer's side: a transaction left open and idle this long is ended
        "idle_in_transaction_session_timeout": ms,
        # the waiter's side: a row lock not had within this long fails (55P03)
        "lock_timeout": ms,
        # a statement still running after three bounds is cancelled (57014): no flush
        # statement comes near it (one statement writes at most max_batch rows)
        "statement_timeout": 3 * ms,
    }
    return "SELECT " + ", ".join(f"set_config('{name}', '{value}', true)"
                                 for name, value in bounds.items())


@functools.cache
def _bounded_connection() -> type[Any]:
    """asyncpg's connection, sending the bound of its next transaction (`next_bounds`, set
    by `_bound_postgres_transactions`) in the same message as the transaction's BEGIN.

    SQLAlchemy begins an asyncpg transaction with one simple-protocol query (``BEGIN
    ISOLATION LEVEL ...;``, asyncpg's ``Transaction.start``). PostgreSQL runs every statement
    of a simple query in order, the ones after a BEGIN inside its transaction, so ``BEGIN ...;
    SELECT set_config(..., true)`` opens the transaction and bounds it in one round trip,
    where a statement of its own costs two more (an unnamed statement is prepared, then run).
    A pooler in transaction mode sees one message and one transaction, as before.
    """
    import asyncpg  # the postgres extra: only a PostgreSQL URL needs it

    class BoundedConnection(asyncpg.Connection):  # type: ignore[misc]
        #: the bound the next BEGIN sets ("": none), taken by that BEGIN
        next_bounds = ""

        async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
            if self.next_bounds and not args and query.startswith("BEGIN"):
                query, self.next_bounds = f"{query} {self.next_bounds}", ""
            return str(await super().execute(query, *args, timeout=timeout))

    return BoundedConnection


def _bound_postgres_transactions(engine: AsyncEngine, ms: int) -> None:
    """Set the transaction bound (`make_engine`) at the start of every transaction, for that
    transaction: it holds on a direct connection and behind a pooler in transaction mode
    alike, where a session setting would stay on whichever server connection it was sent to.
    Sent with the transaction's BEGIN (`_bounded_connection`): no round trip of its own.

    Reads are bounded too (it costs nothing): a reader frozen inside its transaction holds no
    row lock, but behind a pooler it holds one of the pool's server connections, which the
    server's idle bound gives back.
    """
    statement = _postgres_bounds_sql(ms)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # before the driver's BEGIN: asyncpg's transaction starts at the first statement
        conn.connection.driver_connection.next_bounds = statement


def _ping_on_checkout(engine: AsyncEngine) -> None:
    """Check a pooled connection as it leaves the pool with ``SELECT 1`` as a simple-protocol
    query: one round trip, no transaction and no statement to prepare (SQLAlchemy's own
    pre-ping over asyncpg sends BEGIN, prepares and runs ``;`` and rolls back: four round
    trips, on every checkout; asyncpg fails an empty simple query). A failed ping replaces
    the connection (the pool's disconnect handling); a connection just made is not pinged.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(_dbapi_conn: Any, record: Any) -> None:
        record.info[_FRESH] = True

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        if record.info.pop(_FRESH, False):
            return
        try:
            dbapi_conn.run_async(lambda raw: raw.execute("SELECT 1"))
        except Exception as exc:  # any failure: this connection is of no use
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc


def _mysql_engine(full: str, transaction_timeout: float | None,
                  pool_timeout: float) -> AsyncEngine:
    """MySQL/MariaDB through aiomysql, set up so the flush's SQL means what it says.

    * ``client_flag=0``: SQLAlchemy's MySQL dialects set CLIENT_FOUND_ROWS, under which a row
      an ``ON DUPLICATE KEY UPDATE`` leaves unchanged counts 1, like an insert. Without it the
      counts are 1 inserted, 2 updated, 0 unchanged, so a fenced upsert's row count tells
      whether every row went through (`localstate._sync.central.dialects`); the driver adds its
      default capabilities to 0.
    * utf8mb4 on the connection, UTC as the session time zone (DATETIME keeps no offset; the
      store writes and reads UTC).
    * READ COMMITTED: no gap locks, so concurrent flushes of new keys do not deadlock on the
      gaps between them; every fenced write still sees and locks the latest committed row,
      as on PostgreSQL.
    * the transaction bound (`make_engine`): ``innodb_lock_wait_timeout`` for the waiter;
      for the frozen writer, MariaDB's ``idle_transaction_timeout`` (10.3+) ends a transaction
      left idle, and on MySQL, which has no such variable, ``wait_timeout`` ends any idle
      session (the pool's pre-ping replaces a pooled connection it closed).
    """
    parsed = make_url(full)
    if "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    engine = create_async_engine(
        parsed, pool_pre_ping=True, pool_size=5, max_overflow=5, pool_timeout=pool_timeout,
        pool_recycle=3600, isolation_level="READ COMMITTED",
        connect_args={"client_flag": 0, "init_command": "SET time_zone = '+00:00'"},
    )
    if transaction_timeout is not None:
        _bound_mysql_sessions(engine, max(1, round(transaction_timeout)))
    return engine


def _bound_mysql_sessions(engine: AsyncEngine, seconds: int) -> None:
    """Set the session variables of the transaction bound on each new connection (their
    names differ between MariaDB and MySQL, so not in ``init_command``)."""

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        cursor.execute("SELECT VERSION()")
        mariadb = "mariadb" in str(cursor.fetchone()[0]).lower()
        idle = "idle_transaction_timeout" if mariadb else "wait_timeout"
        cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {seconds}, "
                       f"SESSION {idle} = {seconds}")
        cursor.close()


def _configure_sqlite(engine: AsyncEngine) -> None:
    """WAL plus BEGIN IMMEDIATE for every transaction.

    pysqlite's own implicit BEGIN is deferred: a flush that reads before it writes would try to
    upgrade its read lock and fail with SQLITE_BUSY when another process wrote meanwhile (busy
    timeouts do not apply to that). Taking the write lock up front makes concurrent triggerers
    queue instead (the recipe in SQLAlchemy's pysqlite documentation).
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        # the busy timeout first: switching a new file to WAL takes its exclusive lock, and
        # processes opening it together would otherwise fail at once ("database is locked")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # A reader never upgrades its lock, and under WAL a deferred read never waits for the
        # writer: a status page, or a triggerer loading an owner it takes over, must not queue
        # behind another process's flush (or behind one paused mid-flush, for busy_timeout).
        read_only = conn.get_execution_options().get(_READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


@asynccontextmanager
async def read_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for statements that only read: on SQLite its transaction is deferred, so
    it reads the last committed state without taking the write lock. Do not write through it.
    """
    async with engine.connect() as conn:
        yield await conn.execution_options(**{_READ_ONLY: True})


