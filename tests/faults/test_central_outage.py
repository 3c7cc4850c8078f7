"""Central outages: PostgreSQL or MySQL stopped, restarted, and restarted again under a write
loop.

Every acknowledged write must reach the central DB exactly once (each key's central version is
the number of times it was set, its value the last one set), and after each return of the DB
the flush lag must recover within two flush intervals: the worker's retry backoff is capped at
one interval, so its next try comes within one interval of the DB's return.

Related scenarios elsewhere: connections cut by ``pg_terminate_backend`` in the middle of flush
transactions (`test_connection_cut.py`); one outage per stop mode and `central` writes timing
out during an outage (`tests/unit/test_sync_worker.py`); memory and cache size staying flat through
a 30 s outage of 1,000 writing triggers (`test_soak.py`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
from central_history import current_rows
from fault_tally import FaultTally

from localstate import CentralUnavailable, StateStore
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer

OWNERS, KEYS = 20, 10
FLUSH_INTERVAL = 1.0
# the promise: the lag recovers within two flush intervals of the DB's return
RECOVERY_DEADLINE = 2 * FLUSH_INTERVAL


async def flush_until_clean(store: StateStore, sink: str, within: float = 30.0) -> None:
    """Flush `store` until nothing is dirty, retrying while `sink` is still unreachable."""
    deadline = time.monotonic() + within
    while store.stats().dirty_keys:
        try:
            await store.flush()
        except CentralUnavailable:
            assert time.monotonic() < deadline, f"{sink} never came back"
            await asyncio.sleep(0.1)


class WriteLoop:
    """Sets every key over and over (local durability), counting what was acknowledged."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.keys = [(f"trigger:outage-{o:02d}", f"k{k}") for o in range(OWNERS)
                     for k in range(KEYS)]
        self.counts = dict.fromkeys(self.keys, 0)
        self.last: dict[tuple[str, str], int] = {}
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    async def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            i += 1
            batch = [k for j, k in enumerate(self.keys) if (i + j) % 3 == 0]
            versions = await asyncio.gather(*(self.store.set(o, k, i) for o, k in batch))
            for k, version in zip(batch, versions, strict=True):
                self.counts[k] += 1
                self.last[k] = i
                assert version == self.counts[k]  # acknowledged, at the next local version
            await asyncio.sleep(0.005)

    async def until(self, check: Callable[[], bool], what: str, timeout: float = 60) -> float:
        """Wait (bounded) until `check()` holds while the loop writes on; the time it took."""
        start = time.monotonic()
        while not check():
            if self.task.done():
                self.task.result()  # a failed set fails the test here
                raise AssertionError(f"the write loop stopped before {what}")
            if time.monotonic() - start > timeout:
                raise AssertionError(f"gave up waiting for {what} after {timeout} s")
            await asyncio.sleep(0.01)
        return time.monotonic() - start

    async def close(self) -> None:
        self.stop.set()
        await self.task


async def recovered_within(loop: WriteLoop, back_at: float) -> float:
    """Seconds from the DB's return (`back_at`, POSIX) until the lag recovered.

    Recovered: a flush succeeded after the return, and no write the central DB lacks is older
    than one flush interval.
    """
    store = loop.store

    def recovered() -> bool:
        s = store.stats()
        # a flush cannot succeed while the DB is down: one that ended after the return ran
        # after it
        return (s.last_error is None and s.last_flush_at is not None
                and s.last_flush_at >= back_at and s.oldest_unflushed_s < FLUSH_INTERVAL)

    await loop.until(recovered, "the flush lag to recover", timeout=RECOVERY_DEADLINE)
    return time.time() - back_at


async def test_stops_and_restarts_lose_and_duplicate_nothing_and_the_lag_recovers(
    db_server: PostgresServer | MysqlServer, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    dbname = f"outage_{uuid.uuid4().hex[:12]}"
    url = db_server.create_database(dbname)
    if isinstance(db_server, PostgresServer):
        # the server runs with synchronous_commit=off; an immediate stop must not lose commits
        # the store was told about, or "exactly once" would test the server's settings, not
        # the store (the MySQL server's commits reach the OS before they return)
        db_server.psql(f"ALTER DATABASE {dbname} SET synchronous_commit = on",
                       dbname="postgres")
    store = await StateStore.open(central_url=url, cache_path=tmp_path / "outage.db",
                                  triggerer_id="outage", flush_interval=FLUSH_INTERVAL)
    recoveries: list[float] = []
    try:
        loop = WriteLoop(store)
        try:
            await loop.until(lambda: store.stats().flushes >= 2, "flushes before the outage")
            for stop_mode, down_for in (("fast", 2.5), ("immediate", 0.0), ("fast", 0.0)):
                await asyncio.to_thread(db_server.stop, stop_mode)
                try:
                    if down_for:
                        # the store notices, keeps acknowledging writes, and the lag grows
                        await loop.until(lambda: store.stats().central_errors > 0,
                                         "the worker to notice the outage")
                        during = loop.total
                        await asyncio.sleep(down_for)
                        stats = store.stats()
                        assert loop.total > during, "writes stalled during the outage"
                        assert stats.dirty_keys > 0
                        assert stats.oldest_unflushed_s > FLUSH_INTERVAL
                finally:
                    await asyncio.to_thread(db_server.start)
                recoveries.append(await recovered_within(loop, time.time()))
                await asyncio.sleep(0.5)  # write on, flushed normally, before the next stop
        finally:
            await loop.close()
        await flush_until_clean(store, "the central DB")
        assert store.stats().conflicts == 0
    finally:
        await store.close()
    rows = await current_rows(url, "trigger:outage-")
    central = {(owner, key): (version, orjson.loads(value)) for owner, key, value, version in rows}
    expected = {k: (loop.counts[k], loop.last[k]) for k in loop.keys}
    wrong = {k: (central.get(k), v) for k, v in expected.items() if central.get(k) != v}
    fault_tally.add("outages survived", len(recoveries))
    fault_tally.add("acknowledged writes checked", loop.total)
    backend = "mysql" if isinstance(db_server, MysqlServer) else "postgresql"
    fault_tally.lost(f"local, through central outages ({backend})", sum(
        max(0, n - (central.get(k) or (0, 0))[0]) for k, (n, _last) in expected.items()))
    # exactly once: one central version per acknowledged set, holding the last value set
    assert not wrong, f"{len(wrong)} keys differ, (central, expected): {list(wrong.items())[:5]}"
    print(f"\ncentral outages: {loop.total} acknowledged writes, lost=0, duplicated=0; lag "
          f"recovered {', '.join(f'{r:.2f}' for r in recoveries)} s after each return "
          f"(flush interval {FLUSH_INTERVAL} s)")
