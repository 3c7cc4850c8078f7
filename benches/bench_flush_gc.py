"""Where the cyclic GC's time goes during a flush, and how much of the flush it is.

    python benches/bench_flush_gc.py --sizes 10000,50000 --rounds 3

For each size: a store (embedded SQLite central DB, `central_thread=False` so that the whole
flush runs on this thread) holding N keys sets every key again, then flushes. Around every
flush the collector's callbacks time each collection by generation. Reported: the median flush
time, the collections per generation, the time they took, the objects tracked by the GC, and the
same flush with the collector off (`gc.disable()` here, in the benchmark only) as the baseline,
and, after the flushes, the objects the GC tracks and what one full collection costs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from localstate import StateStore


class GcTimer:
    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - self._started


async def one_size(folder: Path, n: int, rounds: int) -> None:
    store = await StateStore.open(
        cache_path=folder / f"c{n}.db", central_url=f"sqlite:///{folder}/central{n}.db",
        triggerer_id=f"gc{n}", flush_interval=3600.0, max_batch=10**9, central_thread=False,
        durability="memory")
    try:
        for i in range(n):
            await store.set("dag:gc", f"k{i}", i)
        await store.flush()  # the first flush inserts; the measured ones rewrite held rows
        for collector_on in (True, False):
            times: list[float] = []
            timer = GcTimer()
            gc.callbacks.append(timer)
            try:
                for r in range(rounds):
                    for i in range(n):
                        await store.set("dag:gc", f"k{i}", i + r + 1)
                    await store.sync_local()
                    gc.collect()
                    timer.count, timer.seconds = [0, 0, 0], [0.0, 0.0, 0.0]
                    if not collector_on:
                        gc.disable()
                    started = time.perf_counter()
                    await store.flush()
                    times.append(time.perf_counter() - started)
                    gc.enable()
                    if collector_on:
                        counts, secs = list(timer.count), list(timer.seconds)
            finally:
                gc.callbacks.remove(timer)
            label = "gc on " if collector_on else "gc off"
            extra = (f"  collections gen0/1/2 {counts[0]}/{counts[1]}/{counts[2]} "
                     f"taking {secs[0] * 1e3:.1f}/{secs[1] * 1e3:.1f}/{secs[2] * 1e3:.1f} ms "
                     "(last round)") if collector_on else ""
            print(f"flush {n:>6,} keys, {label}: median {statistics.median(times) * 1e3:7.1f} ms"
                  f"{extra}", flush=True)
        full = []
        for _ in range(5):
            started = time.perf_counter()
            gc.collect()
            full.append(time.perf_counter() - started)
        print(f"  after the flushes: {len(gc.get_objects()):,} objects tracked by the GC; a full "
              f"collection takes {statistics.median(full) * 1e3:.1f} ms (median of 5)", flush=True)
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,50000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            await one_size(Path(tmp), n, args.rounds)


if __name__ == "__main__":
    asyncio.run(main())
