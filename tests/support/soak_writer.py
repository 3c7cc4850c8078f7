"""The soak's writer process: ``python soak_writer.py <json options>``.

It opens a `StateStore` (local durability) and runs `triggers` asyncio tasks, each a trigger
setting its own watermark (an integer, one more each time) and, every tenth write, a cursor
object, then sleeping `pace` seconds. Every `sample_every` seconds it reports, one tab-separated
line on stdout: ``SAMPLE <seconds since start> <VmRSS bytes> <cache db bytes> <cache wal bytes>
<dirty keys> <sets> <central errors>``. On a line ``stop`` on stdin it stops the triggers
(each after its set in progress), flushes until the central DB holds everything (retrying
while it is down), reports ``COUNT <owner> <key> <acknowledged sets> <last value JSON>`` for
every key and ``DONE``, and closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from localstate import CentralUnavailable, StateStore
from localstate._bench.child_process import file_bytes, report_line, rss_bytes


async def main(options: dict[str, Any]) -> None:
    cache = Path(options["cache_path"])
    store = await StateStore.open(
        central_url=options["central_url"], cache_path=cache, triggerer_id="soak",
        flush_interval=options["flush_interval"],
    )
    counts: dict[tuple[str, str], int] = {}
    last: dict[tuple[str, str], Any] = {}
    stop = asyncio.Event()

    async def trigger(i: int) -> None:
        owner = f"asset_watcher:soak-{i:04d}"
        n = 0
        while not stop.is_set():
            n += 1
            writes: list[tuple[str, Any]] = [("watermark", n)]
            if n % 10 == 0:
                writes.append(("cursor", {"page": n, "token": f"{i:04d}-{n:08d}" * 4}))
            for key, value in writes:
                await store.set(owner, key, value)
                counts[owner, key] = counts.get((owner, key), 0) + 1
                last[owner, key] = value
            await asyncio.sleep(options["pace"])

    async def sample() -> None:
        started = time.monotonic()
        while not stop.is_set():
            s = store.stats()
            report_line("SAMPLE", f"{time.monotonic() - started:.2f}", rss_bytes(),
                        file_bytes(cache), file_bytes(cache.with_name(cache.name + "-wal")),
                        s.dirty_keys, s.sets, s.central_errors)
            await asyncio.sleep(options["sample_every"])

    triggers = [asyncio.create_task(trigger(i)) for i in range(options["triggers"])]
    sampler = asyncio.create_task(sample())
    await asyncio.to_thread(sys.stdin.readline)  # "stop", or the end of input
    stop.set()
    await asyncio.gather(*triggers, sampler)
    deadline = time.monotonic() + 60
    while store.stats().dirty_keys:
        try:
            await store.flush()
        except CentralUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    for (owner, key), n in sorted(counts.items()):
        report_line("COUNT", owner, key, n, json.dumps(last[owner, key], separators=(",", ":")))
    report_line("DONE")
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
