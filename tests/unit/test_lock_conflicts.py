"""Flushes that meet another writer's row locks on the central DB.

Two triggerers flush the same keys when an owner fails over while its old triggerer (a zombie)
still runs it. Their flushes must queue behind each other rather than deadlock, and the flush
at close, which has no later flush to fall back on, must outlast a refusal that a retry gets
past (a lock timeout, a deadlock).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import pytest_asyncio
from sqlalchemy import text

from localstate import StateStore
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.engine import make_engine
from localstate._sync.central.schema import STATE_TABLE
from localstate._testing.postgres_server import PostgresServer

OWNER = "asset_watcher:orders"
KEYS = 400


def rows_by(writer: str, keys: list[str], version: int) -> list[DirtyRow]:
    now = time.time()
    return [DirtyRow(OWNER, k, orjson.dumps({"by": writer, "n": version}).decode(),
                     version, 0, now, writer) for k in keys]


@pytest_asyncio.fixture
async def two_writers(central_url: str) -> AsyncIterator[tuple[CentralStore, CentralStore]]:
    a = await CentralStore.open(central_url)
    b = await CentralStore.open(central_url)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"], indirect=True)
async def test_flushes_of_the_same_keys_in_opposite_orders_never_deadlock(
    two_writers: tuple[CentralStore, CentralStore],
) -> None:
    """A zombie and its successor flush the same keys, each in its own order (the age of its
    dirty keys): under `max` both lock every row first. Without one lock order the server
    picks a victim (MariaDB 1213, PostgreSQL 40P01) within a few rounds."""
    a, b = two_writers
    keys = [f"k{i:04d}" for i in range(KEYS)]
    policies = PolicyMap("max")
    await a.write_batch(rows_by("zombie", keys, 1), policies, writer="zombie")
    for n in range(2, 12):
        # both based on an old version: the policy, not the version fence, decides; both
        # flushes lock all KEYS rows, one from the first key, the other from the last
        outcomes_a, outcomes_b = await asyncio.gather(
            a.write_batch(rows_by("zombie", keys, n), policies, writer="zombie"),
            b.write_batch(rows_by("successor", keys[::-1], n), policies, writer="successor"),
        )
        assert len(outcomes_a) == len(outcomes_b) == KEYS


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_close_retries_a_flush_the_central_db_refuses_for_now(
    central_url: str, pg_server: PostgresServer, tmp_path: Path,
) -> None:
    """Another session holds the row's lock for 0.6 s; the database's ``lock_timeout``
    (0.3 s) refuses the tries meanwhile (55P03). The close flush tries again (up to
    `CLOSE_TRIES` times) instead of leaving the write to the next start."""
    dbname = central_url.rsplit("/", 1)[1]
    pg_server.psql(f"ALTER DATABASE {dbname} SET lock_timeout = '300ms'", dbname="postgres")
    store = await StateStore.open(
        central_url=central_url, cache_path=tmp_path / "cache.db",
        triggerer_id="t", flush_interval=3600, close_timeout=10)
    closed = False
    try:
        await store.set(OWNER, "wm", 1)
        await store.flush()
        await store.set(OWNER, "wm", 2)
        engine = make_engine(central_url)
        try:
            async with engine.connect() as blocker:
                await blocker.execute(text(
                    f"SELECT 1 FROM {STATE_TABLE} WHERE \"key\" = 'wm' FOR UPDATE"))
                closing = asyncio.ensure_future(store.close())
                await asyncio.sleep(0.6)  # two tries at least meet the lock meanwhile
                assert not closing.done()
                await blocker.rollback()
            await closing
            closed = True
        finally:
            await engine.dispose()
    finally:
        if not closed:
            await store.close()
    central = await CentralStore.open(central_url)
    try:
        [row] = (await central.read_many([(OWNER, "wm")])).values()
    finally:
        await central.close()
    assert row.data is not None
    assert orjson.loads(row.data) == 2
