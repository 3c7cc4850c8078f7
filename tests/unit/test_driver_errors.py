"""Every "the server is not there right now" error is `CentralUnavailable`, never a bare
`CentralError` (callers retry on the one and not on the other): the classifier, with the
drivers' own exception classes (the codes a real server sends too rarely to provoke on cue:
starting up, crash shutdown, deadlocks), and a real failure on SQLite.

A real PostgreSQL server stopped, shutting down and killing a backend:
tests/integration/test_driver_errors_postgres.py (MariaDB's: test_driver_errors_mysql.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError, OperationalError

from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.driver_errors import is_unreachable
from localstate.errors import CentralError, CentralUnavailable

KEY = ("o", "k")


def _wrapped(orig: BaseException) -> DBAPIError:
    return OperationalError("SELECT 1", {}, orig)


@pytest.mark.parametrize("error", [
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.CrashShutdownError("terminating connection because of crash"),
    asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.exceptions.SerializationError("could not serialize access"),
    asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle"),
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError(),
    sqlite3.OperationalError("database is locked"),
], ids=lambda e: type(e).__name__ + (f":{e}" if "system" in str(e) else ""))
def test_transient_driver_errors_are_unreachable(error: BaseException) -> None:
    assert is_unreachable(error)
    assert is_unreachable(_wrapped(error))


@pytest.mark.parametrize("error", [
    asyncpg.exceptions.UndefinedTableError("relation does not exist"),
    asyncpg.exceptions.NumericValueOutOfRangeError("bigint out of range"),
    asyncpg.exceptions.InterfaceError("cannot perform operation: another operation is in "
                                      "progress"),
    sqlite3.OperationalError("no such table: localstate_state"),
    sqlite3.IntegrityError("NOT NULL constraint failed"),
], ids=lambda e: type(e).__name__)
def test_real_failures_are_not_unreachable(error: BaseException) -> None:
    assert not is_unreachable(error)
    assert not is_unreachable(_wrapped(error))


async def test_a_real_failure_is_a_central_error_not_unavailable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'central.db'}"
    central = await CentralStore.open(url)
    try:
        async with central.engine.begin() as conn:
            await conn.exec_driver_sql("DROP TABLE localstate_state")
        with pytest.raises(CentralError, match="no such table") as caught:
            await central.read_many([KEY])
        assert not isinstance(caught.value, CentralUnavailable)
    finally:
        await central.close()
