"""The trigger of the benchmark's ``sink = airflow`` row, run by a real ``airflow triggerer``.

`FlushBenchTrigger` watches one asset with localstate's mixin, so its store's ``airflow`` sink
writes through the accessors Airflow gave it: each call a request to the triggerer's supervisor,
which makes it an Execution API call and a transaction on Airflow's ``asset_state_store``. It
talks to the benchmark through files in `folder`:

1. it reads one key through (the first call through the supervisor is slow: it starts the
   Execution API), sets `keys` keys of its asset's owner (``memory`` durability, then the
   local commit) and writes ``ready.json``;
2. it waits for ``go`` (the benchmark reads the database's commit counter first), then flushes
   until no key is dirty (the sink's flush is bounded in time: several ``flush()`` calls),
   writing ``progress.json`` after each;
3. it writes ``done.json`` (seconds, flushes, the sink's ``aset``/``aget`` calls) and idles
   until the triggerer stops it.

Every file is written whole under a temporary name, then renamed: a reader never sees half.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate._sync.sinks.airflow_sink import process_sink
from localstate.airflow.trigger import StateEnabledTrigger
from localstate.errors import CentralUnavailable, reason

__all__ = ["FlushBenchTrigger", "write_file"]

#: seconds between two looks for the ``go`` file
_POLL = 0.05


def write_file(path: Path, payload: Any) -> None:
    """`payload` as JSON in `path`, whole or not at all (written aside, then renamed)."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    aside.write_text(json.dumps(payload))
    aside.replace(path)


async def _appears(path: Path) -> None:
    """Return once `path` exists (another process makes it: there is no event to wait on)."""
    while True:
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(_POLL)


class FlushBenchTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Dirties `keys` keys, then times the flush of all of them through ``sink = airflow``."""

    def __init__(self, folder: str, keys: int) -> None:
        super().__init__()
        self.folder = folder
        self.keys = keys

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"folder": self.folder, "keys": self.keys})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        folder = Path(self.folder)
        store = await self.open_state()
        owner = self.state_owner
        # the first call through the supervisor starts Airflow's Execution API in the
        # triggerer (seconds): a read-through miss makes it, before anything is timed
        started = time.perf_counter()
        await store.get(owner, "bench_warm_up")
        warm_up = time.perf_counter() - started
        for i in range(self.keys):
            await store.set(owner, f"key_{i:06d}", i + 1, durability="memory")
        await store.sync_local()  # the local commit is not the flush's work
        write_file(folder / "ready.json", {"owner": owner, "warm_up_s": warm_up,
                                           "dirty": store.stats().dirty_keys})
        await _appears(folder / "go")
        sink = process_sink()
        asets, agets = sink.transactions, sink.reads
        flushes, errors, last_error = 0, 0, ""
        started = time.perf_counter()
        while (dirty := store.stats().dirty_keys) > 0:
            try:
                await store.flush()
            except CentralUnavailable as exc:  # nothing got through this time: again
                errors, last_error = errors + 1, reason(exc)
                await asyncio.sleep(0.1)
            flushes += 1
            write_file(folder / "progress.json", {
                "dirty": store.stats().dirty_keys, "before": dirty,
                "seconds": time.perf_counter() - started})
        seconds = time.perf_counter() - started
        write_file(folder / "done.json", {
            "keys": self.keys, "seconds": seconds, "flushes": flushes,
            "asets": sink.transactions - asets, "agets": sink.reads - agets,
            "errors": errors, "last_error": last_error})
        await asyncio.Event().wait()  # idle: the benchmark stops the triggerer
        yield TriggerEvent({})  # never reached: an async generator, as Airflow wants
