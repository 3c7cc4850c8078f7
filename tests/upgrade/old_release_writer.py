"""Runs under the *previous* release (tests/packaging/test_upgrade.py puts its source first on
the path), never under this tree's code. Two modes:

``crash CENTRAL CACHE N``: writes N keys, flushes them (v1), writes them again (v2), then
flushes once more and, inside that flush, after its central commit and before its mark-clean,
writes them a third time (v3, acknowledged locally) and SIGKILLs itself: the flush window.

``random CENTRAL CACHE KEYS SEED``: writes ``i`` to a random one of KEYS keys, i = 1, 2, ...,
flushing every 20 ms, and prints ``KEY i`` once each set is acknowledged, until killed.

``linger CENTRAL CACHE``: opens a store and follows commands on stdin, one per line:
``write OWNER KEY VALUE`` sets and flushes, answering ``ok`` or ``error <message>``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from typing import Any

import localstate
from localstate import StateStore
from localstate.sync.worker import SyncWorker

OWNER = "asset_watcher:upgrade"


async def _open(central: str, cache: str, triggerer: str) -> StateStore:
    return await StateStore.open(central_url=central, cache_path=cache, triggerer_id=triggerer,
                                 flush_interval=3600.0, upgrade_schema=True)


async def crash(central: str, cache: str, n: int) -> None:
    store = await _open(central, cache, "triggerer-old")
    keys = [f"k{i}" for i in range(n)]
    for k in keys:
        await store.set(OWNER, k, {"v": 1})
    await store.flush()
    for k in keys:
        await store.set(OWNER, k, {"v": 2})
    write_batch = SyncWorker.write_batch

    async def committed_then_killed(self: SyncWorker, rows: Any) -> Any:
        outcomes = await write_batch(self, rows)  # committed centrally
        for k in keys:
            await store.set(OWNER, k, {"v": 3})  # acknowledged locally
        print("acknowledged", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        return outcomes

    SyncWorker.write_batch = committed_then_killed  # type: ignore[method-assign]
    await store.flush()


async def random_writes(central: str, cache: str, n_keys: int, seed: int) -> None:
    store = await StateStore.open(central_url=central, cache_path=cache,
                                  triggerer_id="triggerer-old", flush_interval=0.02,
                                  upgrade_schema=True)
    rng = random.Random(seed)
    i = 0
    while True:
        i += 1
        key = f"k{rng.randrange(n_keys)}"
        await store.set(OWNER, key, i)
        print(key, i, flush=True)


async def linger(central: str, cache: str) -> None:
    store = await _open(central, cache, "triggerer-zombie")
    print("ready", localstate.__file__, flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        _cmd, owner, key, value = line.split()
        try:
            await store.set(owner, key, int(value))
            await store.flush()
        except Exception as exc:
            print("error", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
        else:
            print("ok", flush=True)


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "crash":
        asyncio.run(crash(args[0], args[1], int(args[2])))
    elif mode == "random":
        asyncio.run(random_writes(args[0], args[1], int(args[2]), int(args[3])))
    else:
        asyncio.run(linger(args[0], args[1]))
