"""Which database driver errors mean "the central DB is not there right now".

`CentralStore` wraps every driver error: those this module calls *unreachable* become
`CentralUnavailable` (retry later: the sync worker backs off, a caller may retry), everything
else `CentralError` (a real failure: retrying the same statement fails the same way).

Unreachable covers the server being down, going down, coming up or dropping our connection, and
the transient refusals a retry gets past: connection refused or reset, ``the database system is
shutting down`` / ``is starting up`` (SQLSTATE 57P03), ``terminating connection due to
administrator command`` (57P01, what ``pg_terminate_backend`` and a fast shutdown send), a crash
shutdown (57P02), too many connections (53300), serialization failures and deadlocks (40001,
40P01), a lock or statement timeout (55P03, 57014), any OS-level socket or timeout error, and
SQLite's busy/locked file. PostgreSQL's
errors are told apart by SQLSTATE, never by message text (messages are translated with
``lc_messages``); SQLite's driver gives no codes through SQLAlchemy, so its few are matched by
their fixed English text. MySQL's (and MariaDB's) by their error numbers (`_MYSQL_UNREACHABLE`:
the client's connection errors, server shutdown, a killed connection, lock wait timeouts and
deadlocks, too many connections), which PyMySQL/aiomysql give as the exception's first
argument.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = ["is_unreachable"]

#: SQLSTATE classes and codes that mean "not there right now" (PostgreSQL appendix A).
_UNREACHABLE_CLASSES: Final = frozenset({"08"})  # connection exception
_UNREACHABLE_CODES: Final = frozenset({
    "57P01",  # admin_shutdown: pg_terminate_backend, or a fast/immediate shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now: starting up, shutting down, in recovery
    "57P05",  # idle_session_timeout
    "25P03",  # idle_in_transaction_session_timeout: the server ended our frozen transaction
    "53300",  # too_many_connections
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available
    "57014",  # query_canceled (statement_timeout)
})
#: MySQL/MariaDB error numbers that mean "not there right now" (client errors 2xxx, server
#: errors below 2000 and from 3000 up).
_MYSQL_UNREACHABLE: Final = frozenset({
    2002,  # CR_CONNECTION_ERROR: cannot connect through the socket
    2003,  # CR_CONN_HOST_ERROR: cannot connect to the server (refused, down)
    2006,  # CR_SERVER_GONE_ERROR: server has gone away
    2013,  # CR_SERVER_LOST: lost connection during a query (also how MySQL 8 shows a KILL)
    2055,  # CR_SERVER_LOST_EXTENDED: lost connection, with the system error
    1040,  # ER_CON_COUNT_ERROR: too many connections
    1203,  # ER_TOO_MANY_USER_CONNECTIONS
    1053,  # ER_SERVER_SHUTDOWN: server shutdown in progress
    1077, 1078, 1079, 1080,  # normal shutdown, got signal, shutdown complete, forcing close
    1152, 1159, 1161,  # aborted connection, network read / write timeout
    1205,  # ER_LOCK_WAIT_TIMEOUT
    1213,  # ER_LOCK_DEADLOCK
    1317,  # ER_QUERY_INTERRUPTED: KILL QUERY
    1927,  # MariaDB ER_CONNECTION_KILLED: KILL CONNECTION of a statement's connection
    4031,  # ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+): idle connection closed
})
#: SQLite: another connection holds the write lock past busy_timeout.
_SQLITE_BUSY: Final = ("database is locked", "database table is locked")


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` (a driver error, wrapped by SQLAlchemy or not) means "retry later"."""
    if isinstance(exc, PoolTimeout):  # every pooled connection busy past pool_timeout
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    start = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return any(_one_unreachable(cause) for cause in _chain(start))


def _chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the exceptions behind it (an adapted driver error keeps the driver's own)."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _mysql_error_number(exc: BaseException) -> int | None:
    """PyMySQL's (and so aiomysql's) error number: ``exc.args == (number, message)``."""
    if not type(exc).__module__.startswith(("pymysql", "aiomysql")):
        return None
    number = exc.args[0] if exc.args else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _one_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, TimeoutError)):  # ConnectionError is an OSError
        return True
    mysql_code = _mysql_error_number(exc)
    if mysql_code is not None:
        return mysql_code in _MYSQL_UNREACHABLE
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate[:2] in _UNREACHABLE_CLASSES or sqlstate in _UNREACHABLE_CODES
    name, module = type(exc).__name__, type(exc).__module__
    if module.startswith("asyncpg"):
        # asyncpg's client-side errors carry no SQLSTATE: a connection lost mid-query, or used
        # after the server closed it
        return name == "ConnectionDoesNotExistError" or (
            name == "InterfaceError" and "connection is closed" in str(exc))
    text = str(exc).lower()
    return any(marker in text for marker in _SQLITE_BUSY) and "sqlite" in module
