"""What a triggerer's state costs in memory and on its cache volume, per number of keys.

    python benches/bench_sizing.py --json docs/bench-sizing.json

One store (an embedded SQLite central DB, which does not change what the store holds) takes
`--sizes` keys, one watermark per owner as a trigger keeps it (a small JSON object), flushed;
after each size: the process's resident memory above the store with one key (the baseline
measured in the same run), and the bytes of the cache file and its WAL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import psutil

from localstate import StateStore
from localstate._bench.report import machine_info


async def run(folder: Path, sizes: list[int]) -> dict[str, Any]:
    process = psutil.Process()
    rows = []
    async with StateStore(cache_path=folder / "cache.db",
                          central_url=f"sqlite:///{folder / 'central.db'}",
                          triggerer_id="sizing", flush_interval=3600) as store:
        await store.set("warm:0", "watermark", 0)
        await store.flush()
        baseline = process.memory_info().rss
        n = 0
        for size in sizes:
            while n < size:  # first writes read through: many per query
                batch = range(n, min(size, n + 5000))
                await asyncio.gather(*(store.set(
                    f"asset_watcher:sizing-{i:07d}", "watermark",
                    {"ts": "2026-12-06T22:00:00+00:00", "offset": i}) for i in batch))
                n = batch.stop
            await store.flush()
            await store.sync_local()
            stats = store.stats()
            rss = process.memory_info().rss - baseline
            rows.append({"keys": size, "rss_bytes": rss,
                         "cache_file_bytes": stats.cache_file_bytes,
                         "keys_in_memory": stats.keys_in_memory})
            print(f"{size:>9,} keys: +{rss / 2**20:6.1f} MiB resident "
                  f"({rss / size * 1000 / 2**20:.2f} MiB per 1,000), cache file and WAL "
                  f"{stats.cache_file_bytes / 2**20:6.1f} MiB", flush=True)
    return {"machine": machine_info(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1000, 10_000, 100_000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ls-sizing-") as tmp:
        result = asyncio.run(run(Path(tmp), args.sizes))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
