"""Every "the server is not there right now" error is `CentralUnavailable`, never a bare
`CentralError` (callers retry on the one and not on the other).

Against a PostgreSQL server of this module's own (it is stopped and its sessions killed):
connection refused, shutting down, a backend terminated by an administrator. The codes a real
server sends too rarely to provoke on cue (starting up, crash shutdown, deadlocks) are checked on
the classifier with the driver's own exception classes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from sqlalchemy.exc import DBAPIError, OperationalError

from localstate._sync.central_store import CentralStore
from localstate._sync.driver_errors import is_unreachable
from localstate._testing.postgres_server import PostgresServer
from localstate.errors import CentralError, CentralUnavailable

KEY = ("o", "k")


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[PostgresServer]:
    with PostgresServer(tmp_path / "pg") as server:
        yield server


@pytest_asyncio.fixture
async def central(pg: PostgresServer) -> AsyncIterator[CentralStore]:
    store = await CentralStore.open(pg.url)
    yield store
    await store.close()


async def test_a_stopped_server_is_unavailable(pg: PostgresServer, central: CentralStore
                                               ) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    pg.stop("fast")
    with pytest.raises(CentralUnavailable, match="failed to read"):
        await central.read_many([KEY])


async def test_a_server_shutting_down_is_unavailable(pg: PostgresServer, central: CentralStore
                                                      ) -> None:
    held = await asyncpg.connect(pg.dsn)  # a smart shutdown waits for this session to end
    try:
        pg.stop("smart", wait=False)
        with pytest.raises(CentralUnavailable, match="shutting down"):
            await CentralStore.open(pg.url, upgrade_schema=False)
    finally:
        await held.close()


async def test_a_terminated_backend_is_unavailable(pg: PostgresServer, central: CentralStore
                                                   ) -> None:
    await central.write_direct(*KEY, '"v"', updated_at=1.0, updated_by="t")
    blocker = await asyncpg.connect(pg.dsn)
    try:
        # hold the row's lock, so the store's write waits inside its statement...
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT * FROM localstate_state FOR UPDATE")
        write = asyncio.create_task(
            central.write_direct(*KEY, '"w"', updated_at=2.0, updated_by="t"))
        await wait_for_a_lock_wait(blocker)
        # ...and kill its backend there: 57P01, "terminating connection due to administrator
        # command"
        await blocker.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock'")
        with pytest.raises(CentralUnavailable, match="failed to write"):
            await write
        await tx.rollback()
    finally:
        await blocker.close()
    assert (await central.read_many([KEY]))[KEY].data == '"v"'  # and it reconnects


async def wait_for_a_lock_wait(conn: asyncpg.Connection) -> None:
    """Until some backend waits for a lock (PostgreSQL offers no notification of it)."""
    for _ in range(500):
        if await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no backend ever waited for the row lock")


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
