"""`sink = api` through outages of the API server: `localstate serve` SIGKILLed (connections
dropped, flushes cut mid-request), writes going on meanwhile, the server restarted on the same
port.

As with the SQL sink's outages (`test_central_outage.py`): every acknowledged write reaches the
central DB exactly once (each key's central version is the number of times it was set, its
value the last one set), the central DB's own history (a trigger on the table) never shows a
version or a value going down, writes keep being acknowledged while the server is gone, and the
worker catches up once it is back.
"""

from __future__ import annotations

import asyncio
import random
import time
from functools import partial
from pathlib import Path

import orjson
from api_server import RW_TOKEN, ServeProcess
from central_history import current_rows, install, read, regressions
from fault_tally import FaultTally
from test_central_outage import WriteLoop, flush_until_clean

from localstate import StateStore

FLUSH_INTERVAL = 0.5
ROUNDS = 3


def noticed(store: StateStore, errors_before: int) -> bool:
    return store.stats().central_errors > errors_before


def flushed_since(store: StateStore, at: float) -> bool:
    s = store.stats()
    return (s.last_flush_at or 0) >= at and s.last_error is None


async def test_server_killed_mid_run_loses_and_duplicates_nothing(
        central_url: str, tmp_path: Path, fault_tally: FaultTally) -> None:
    server = ServeProcess(central_url, store_id="api-outage-server")
    await asyncio.to_thread(server.start)
    await install(central_url)
    rng = random.Random()
    store = await StateStore.open(sink="api", api_url=server.url, api_token=RW_TOKEN,
                                  cache_path=tmp_path / "outage.db", triggerer_id="api-outage",
                                  flush_interval=FLUSH_INTERVAL)
    kills = 0
    try:
        loop = WriteLoop(store)
        try:
            await loop.until(lambda: store.stats().flushes >= 2, "flushes before the outage")
            for _ in range(ROUNDS):
                # at a random point of the flush cycle, often in the middle of a request
                await asyncio.sleep(rng.uniform(0, FLUSH_INTERVAL))
                errors = store.stats().central_errors
                await asyncio.to_thread(server.kill)
                kills += 1
                await loop.until(partial(noticed, store, errors),
                                 "the worker to notice the outage")
                during = loop.total
                await asyncio.sleep(1.5)
                assert loop.total > during, "writes stalled while the API server was down"
                assert store.stats().dirty_keys > 0
                await asyncio.to_thread(server.start)
                back_at = time.time()
                await loop.until(partial(flushed_since, store, back_at),
                                 "a flush after the restart")
        finally:
            await loop.close()
        await flush_until_clean(store, "the API server")
        assert store.stats().conflicts == 0
    finally:
        await store.close()
        await asyncio.to_thread(server.stop)
    rows = await current_rows(central_url, "trigger:outage-")
    central = {(owner, key): (version, orjson.loads(value)) for owner, key, value, version in rows}
    expected = {k: (loop.counts[k], loop.last[k]) for k in loop.keys}
    wrong = {k: (central.get(k), v) for k, v in expected.items() if central.get(k) != v}
    backwards = regressions(await read(central_url), values=True)
    fault_tally.add("API server kills survived", kills)
    fault_tally.add("acknowledged writes checked", loop.total)
    fault_tally.lost("local, through API server kills (sink = api)", sum(
        max(0, n - (central.get(k) or (0, 0))[0]) for k, (n, _last) in expected.items()))
    # exactly once: one central version per acknowledged set, holding the last value set
    assert not wrong, f"{len(wrong)} keys differ, (central, expected): {list(wrong.items())[:5]}"
    assert not backwards, backwards[:5]
    print(f"\nAPI server SIGKILLed {kills} times: {loop.total} acknowledged writes, lost=0, "
          "duplicated=0, no version or value went down")
