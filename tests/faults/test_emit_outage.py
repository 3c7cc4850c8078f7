"""Emitted events through outages of the API server (``sink = api``): `localstate serve`
SIGKILLed while a trigger keeps emitting (flushes cut mid-request: some committed with their
answer lost), then restarted on the same port. Every emit is acknowledged locally meanwhile,
the events wait in the outbox (`events_pending` grows, the oldest's age shows), and once the
server is back each one is committed exactly once, with no gap, and the outbox empties.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from api_server import RW_TOKEN, ServeProcess
from crash_harness import crash_seed
from sqlalchemy import select

from localstate import StateStore
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import event

OWNER = "trigger:emit-outage"
ROUNDS = 3


async def test_events_wait_out_api_server_outages_and_commit_once(
    central_url: str, tmp_path: Path,
) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    server = ServeProcess(central_url)
    await asyncio.to_thread(server.start)
    store = await StateStore.open(sink="api", api_url=server.url, api_token=RW_TOKEN,
                                  cache_path=tmp_path / "c.db", triggerer_id="emitter",
                                  flush_interval=0.05, central_timeout=5)
    n = 0
    try:
        for _ in range(ROUNDS):
            for _ in range(rng.randint(20, 200)):  # flushes running meanwhile
                n += 1
                await store.emit(OWNER, {"item": n}, watermark=n)
                if n % 7 == 0:
                    await asyncio.sleep(0.001)
            await asyncio.to_thread(server.kill)
            for _ in range(50):  # acknowledged while the server is gone
                n += 1
                await store.emit(OWNER, {"item": n}, watermark=n)
            stats = store.stats()
            assert stats.events_pending >= 50, f"seed {seed}"
            await asyncio.sleep(0.3)
            assert store.stats().oldest_pending_event_s >= 0.3, f"seed {seed}"
            await asyncio.to_thread(server.start)
            for _ in range(200):  # the worker's backoff is at most one flush interval
                if store.stats().events_pending == 0:
                    break
                await asyncio.sleep(0.05)
            assert store.stats().events_pending == 0, f"seed {seed}: {store.stats()}"
        figures = store.event_figures()[OWNER]
        assert figures.emitted == n
        assert figures.committed + figures.duplicates == n
        assert figures.refused == 0
    finally:
        await store.close()
        await asyncio.to_thread(server.stop)
    async with CentralStore.open(central_url) as central:
        e = event.c
        keys = [k for (k,) in await central.run_read(select(e.key).where(e.owner == OWNER),
                                                     "read events")]
    assert sorted(map(int, keys)) == list(range(1, n + 1)), f"seed {seed}"
