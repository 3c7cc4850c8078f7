"""PostgreSQL's "not there right now" errors are `CentralUnavailable`, never a bare
`CentralError`: against a PostgreSQL server of each test's own (it is stopped and its sessions
killed): connection refused, shutting down, a backend terminated by an administrator. (The
classifier itself: tests/unit/test_driver_errors.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from localstate._sync.central.central_store import CentralStore
from localstate._testing.postgres_server import PostgresServer
from localstate.errors import CentralUnavailable

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
