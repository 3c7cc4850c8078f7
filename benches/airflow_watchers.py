"""The watcher trigger of `bench_airflow_watchers.py` (importable by Airflow's triggerer).

Each trigger reads its watermark (timed: the start-up ``get_watermark``), then sets it every
`pace` seconds for `seconds` seconds, timing each ``set_watermark`` itself, and writes its
timings (and when each set began, on the runner's monotonic clock) to
``$LOCALSTATE_BENCH_RESULTS/<name>.json``. The first one also writes there the store's stats,
the trigger runner's GC pauses (measured with ``gc.callbacks``), the trigger loop's lag (a probe
that sleeps `PROBE_S` and records how late it wakes) and the local cache's commits (when each
ended and how long it took, as the loop saw it). Then it idles.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import time
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger

from localstate._sync.sinks.airflow_sink import process_sink
from localstate.airflow.trigger import StateEnabledTrigger

#: (generation, seconds) of each collection in this process since the module was imported
GC_PAUSES: list[tuple[int, float]] = []
_gc_started = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        GC_PAUSES.append((int(info["generation"]), time.perf_counter() - _gc_started[0]))


#: the loop-lag probe's sleep
PROBE_S = 0.02


async def probe(lags: list[tuple[float, float]], commits: list[tuple[float, float]],
                trigger: StateEnabledTrigger) -> None:
    """Record the loop's lag, and copy the local cache's commits before its window drops them."""
    loop = asyncio.get_running_loop()
    seen, tick = 0.0, 0
    while True:
        t = loop.time()
        await asyncio.sleep(PROBE_S)
        now = loop.time()
        lags.append((now, now - t - PROBE_S))
        tick += 1
        if tick % 25 == 0:
            cache = (await trigger.open_state()).local_cache
            if cache is not None:
                fresh = [c for c in cache.recent_commits if c[0] > seen]
                commits.extend(fresh)
                seen = fresh[-1][0] if fresh else seen


if _on_gc not in gc.callbacks:
    gc.callbacks.append(_on_gc)
if os.environ.get("LOCALSTATE_BENCH_IN_FLIGHT"):  # the airflow sink's pipeline depth, for A/B
    process_sink().in_flight = int(os.environ["LOCALSTATE_BENCH_IN_FLIGHT"])


class WatermarkTrigger(StateEnabledTrigger, BaseEventTrigger):
    def __init__(self, name: str, seconds: float, pace: float = 0.2) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.name = name
        self.seconds = seconds
        self.pace = pace

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("airflow_watchers.WatermarkTrigger",
                {"name": self.name, "seconds": self.seconds, "pace": self.pace})

    async def run(self):  # type: ignore[no-untyped-def]
        lags: list[tuple[float, float]] = []
        commits: list[tuple[float, float]] = []
        prober = (asyncio.create_task(probe(lags, commits, self))
                  if self.name.endswith("_0") else None)
        started = time.perf_counter()
        n = await self.get_watermark(default=0)
        get_s = time.perf_counter() - started
        if os.environ.get("LOCALSTATE_BENCH_GC_UNFREEZE") and gc.get_freeze_count():
            gc.unfreeze()  # the baseline: the start-up heap in every full collection
        sets: list[float] = []
        set_at: list[float] = []
        loop = asyncio.get_running_loop()
        end = loop.time() + self.seconds
        gc_before = len(GC_PAUSES)
        while loop.time() < end:
            n += 1
            t = time.perf_counter()
            set_at.append(loop.time())
            await self.set_watermark(n)
            sets.append(time.perf_counter() - t)
            await asyncio.sleep(self.pace)
        out: dict[str, Any] = {"name": self.name, "get_s": get_s, "sets": sets,
                               "set_at": set_at, "last": n, "finished_at": time.time()}
        if self.name.endswith("_0"):
            await asyncio.sleep(3 * self.pace + 2)  # the others' last flushes
            store = await self.open_state()
            out["stats"] = {k: v for k, v in dataclasses.asdict(store.stats()).items()
                            if isinstance(v, (int, float, str)) or v is None}
            out["gc"] = GC_PAUSES[gc_before:]
            out["heap_objects"] = len(gc.get_objects())
            out["frozen_objects"] = gc.get_freeze_count()
            assert prober is not None
            prober.cancel()
            out["loop_lags"], out["commits"] = lags, commits
            sink = process_sink()
            out["sink"] = {"agets": sink.reads, "batch_reads": sink.batch_reads,
                           "batch_fallbacks": sink.batch_fallbacks}
        folder = Path(os.environ["LOCALSTATE_BENCH_RESULTS"])
        (folder / f"{self.name}.json").write_text(json.dumps(out))
        await asyncio.Event().wait()  # idle until the triggerer stops
        yield  # an async generator, as Airflow wants
