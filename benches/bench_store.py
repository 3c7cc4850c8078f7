"""Hot-path benchmark of the store: set/get throughput per durability mode, against the bare limit.

    python benches/bench_store.py [--seconds 1.0] [--json out.json]
    python benches/bench_store.py --eviction-ab [--rounds 5] [--seconds 0.5]

Every figure is measured in this process, in this run, and printed as a ratio against the bare
limit (an ``await`` of a coroutine that sets a dict): the machines are shared and noisy, so only
ratios mean something. Also measures the memory of 100,000 keys of 100-byte values (in a fresh
subprocess, RSS before and after).

``--eviction-ab`` measures the bounded working set (``max_keys_in_memory``) instead: the same
operations in a store whose cap is never reached (A, no eviction) and one with a cap of 10,000
(B), both open in this process, measured in pairs whose order alternates, with 1,000 writers
(each after a warm-up pass, so a hot read measures reads of keys in memory). Two working sets: 1,000
keys (fits in the cap: the hot path must not pay for the bound) and 20,000 keys written in turn
(twice the cap: clean entries are evicted continually behind the writers). Printed per
operation: the median of B/A over the pairs, its spread, and the evictions B made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from localstate import StateStore

Op = Callable[[int, int], Awaitable[Any]]


async def _throughput(op: Op, writers: int, seconds: float) -> float:
    """Operations per second of `writers` coroutines each calling `op` in a loop.

    An op that completes without suspending (a bare dict set, a memory-durability set) never
    lets the event loop run, so each writer checks the clock itself every 64 ops and yields
    once (`sleep(0)`), the same for every mode.
    """
    counts = [0] * writers
    deadline = time.perf_counter() + seconds

    async def loop(w: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            for _ in range(64):
                await op(w, n)
                n += 1
            await asyncio.sleep(0)
        counts[w] = n

    started = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in range(writers)))
    elapsed = time.perf_counter() - started
    return sum(counts) / elapsed


async def run(seconds: float, folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    bare_store: dict[tuple[str, str], Any] = {}

    async def bare_set(w: int, n: int) -> None:
        bare_store[f"o{w}", "watermark"] = n

    async def bare_get(w: int, n: int) -> Any:
        return bare_store.get((f"o{w}", "watermark"))

    owners = [f"trigger:bench:{w}" for w in range(1000)]
    async with StateStore(
        cache_path=folder / "cache.db", central_url=f"sqlite:///{folder}/central.db",
        triggerer_id="bench", flush_interval=1.0,
    ) as store:
        for writers in (1, 1000):
            bare = await _throughput(bare_set, writers, seconds)
            rows.append({"op": "set", "mode": "bare", "writers": writers, "ops_per_s": bare,
                         "ratio_to_bare": 1.0})
            for mode in ("memory", "local", "central"):
                secs = min(seconds, 3.0) if mode == "central" and writers == 1 else seconds

                async def store_set(w: int, n: int, mode: Any = mode) -> None:
                    await store.set(owners[w], "watermark", n, durability=mode)

                ops = await _throughput(store_set, writers, secs)
                rows.append({"op": "set", "mode": mode, "writers": writers, "ops_per_s": ops,
                             "ratio_to_bare": ops / bare})
            bare_g = await _throughput(bare_get, writers, seconds)
            rows.append({"op": "get", "mode": "bare", "writers": writers, "ops_per_s": bare_g,
                         "ratio_to_bare": 1.0})

            async def store_get(w: int, n: int) -> Any:
                return await store.get(owners[w], "watermark")

            ops = await _throughput(store_get, writers, seconds)
            rows.append({"op": "get", "mode": "cached", "writers": writers, "ops_per_s": ops,
                         "ratio_to_bare": ops / bare_g})
            await store.set(owners[0], "doc", {"offsets": list(range(8)), "at": "x" * 40})

            async def store_get_obj(w: int, n: int) -> Any:
                return await store.get(owners[0], "doc")

            ops = await _throughput(store_get_obj, writers, seconds)
            rows.append({"op": "get", "mode": "cached-object", "writers": writers,
                         "ops_per_s": ops, "ratio_to_bare": ops / bare_g})
    return rows


_MEMORY_SCRIPT = r"""
import asyncio, sys, os
from pathlib import Path
from localstate import StateStore
from localstate._bench.child_process import rss_bytes

def rss_mb():
    return rss_bytes() / 2**20

async def main(folder):
    folder = Path(folder)
    async with StateStore(cache_path=folder / "mem.db", central_url=f"sqlite:///{folder}/mc.db",
                          triggerer_id="mem", flush_interval=0.5) as store:
        before = rss_mb()
        value = "v" * 98  # 100 bytes encoded
        for i in range(100_000):
            await store.set(f"trigger:mem:{i % 1000}", f"key{i}", value, durability="memory")
        await store.flush()
        after = rss_mb()
    print(before, after)

asyncio.run(main(sys.argv[1]))
"""


def memory_figure(folder: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, str(folder)], capture_output=True, text=True,
        check=True,
    ).stdout.split()
    before, after = float(out[0]), float(out[1])
    return {"op": "memory", "mode": "100k keys x 100 B", "rss_before_mb": before,
            "rss_after_mb": after, "rss_mb": after, "delta_mb": after - before}


CAP = 10_000
UNBOUNDED = 10**9  # a cap never reached: the store without eviction


def _ab_store(folder: Path, cap: int) -> StateStore:
    (folder / str(cap)).mkdir()
    return StateStore(
        cache_path=folder / str(cap) / "cache.db",
        central_url=f"sqlite:///{folder}/{cap}/central.db",
        triggerer_id="bench", flush_interval=1.0, max_keys_in_memory=cap,
    )


async def _eviction_ab(rounds: int, seconds: float, folder: Path) -> list[dict[str, Any]]:
    """A (never evicts) and B (cap 10,000) open side by side; each operation measured in
    `rounds` pairs whose order alternates (A B, B A, ...), after one unmeasured warm-up pass
    each, so drift in the machine's speed falls on both alike. B/A per pair, then the median."""
    owners = [f"trigger:bench:{w}" for w in range(1000)]
    rows: list[dict[str, Any]] = []
    async with _ab_store(folder, UNBOUNDED) as a, _ab_store(folder, CAP) as b:
        stores = {UNBOUNDED: a, CAP: b}

        async def ab(name: str, make: Callable[[StateStore], Op]) -> None:
            ratios: list[float] = []
            evicted = b.stats().evictions
            for store in (a, b):  # warm-up: the working set is in place before timing
                await _throughput(make(store), 1000, seconds / 5)
            for r in range(rounds):
                ops: dict[int, float] = {}
                for cap in ((UNBOUNDED, CAP) if r % 2 == 0 else (CAP, UNBOUNDED)):
                    ops[cap] = await _throughput(make(stores[cap]), 1000, seconds)
                ratios.append(ops[CAP] / ops[UNBOUNDED])
            rows.append({"op": name, "mode": "eviction B/A", "rounds": rounds,
                         "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                         "ratio_max": max(ratios),
                         "evictions": b.stats().evictions - evicted})
            print(f"{name}: done", file=sys.stderr)

        def memory_set(s: StateStore) -> Op:
            async def op(w: int, n: int) -> None:
                await s.set(owners[w], "watermark", n, durability="memory")
            return op

        def local_set(s: StateStore) -> Op:
            async def op(w: int, n: int) -> None:
                await s.set(owners[w], "watermark", n, durability="local")
            return op

        def cached_get(s: StateStore) -> Op:
            async def op(w: int, n: int) -> Any:
                return await s.get(owners[w], "watermark")
            return op

        def wide_set(s: StateStore) -> Op:  # 20,000 keys: twice the cap
            async def op(w: int, n: int) -> None:
                await s.set(owners[w], f"k{n % 20}", n, durability="memory")
            return op

        await ab("memory set, 1,000 keys", memory_set)
        await ab("local set, 1,000 keys", local_set)
        await ab("cached get, 1,000 keys", cached_get)
        await ab("memory set, 20,000 keys", wide_set)
        for s in (a, b):  # settled: the 20,000 are clean, B's cap now evicts behind reads
            await s.flush()
        await ab("cached get, 1,000 hot of 20,000", cached_get)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--eviction-ab", action="store_true",
                        help="A/B of the bounded working set instead (see the docstring)")
    parser.add_argument("--rounds", type=int, default=5, help="A/B rounds (--eviction-ab)")
    args = parser.parse_args(argv)
    if args.eviction_ab:
        with tempfile.TemporaryDirectory(prefix="localstate-bench-") as tmp:
            rows = asyncio.run(_eviction_ab(args.rounds, args.seconds, Path(tmp)))
        print(f"{'operation':<34} {'B/A median':>10} {'min':>6} {'max':>6} {'evictions':>10}")
        for r in rows:
            print(f"{r['op']:<34} {r['ratio_median']:>10.2f} {r['ratio_min']:>6.2f} "
                  f"{r['ratio_max']:>6.2f} {r['evictions']:>10,}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="localstate-bench-") as tmp:
        rows = asyncio.run(run(args.seconds, Path(tmp)))
        mem_dir = Path(tmp) / "mem"
        mem_dir.mkdir()
        rows.append(memory_figure(mem_dir))
    print(f"{'op':<5} {'mode':<14} {'writers':>7} {'ops/s':>12} {'x bare':>8}")
    for r in rows:
        if r["op"] == "memory":
            print(f"memory: 100,000 keys of 100-byte values: RSS {r['rss_after_mb']:.0f} MB "
                  f"(+{r['delta_mb']:.0f} MB over the open store)")
            continue
        print(f"{r['op']:<5} {r['mode']:<14} {r['writers']:>7} {r['ops_per_s']:>12,.0f} "
              f"{r['ratio_to_bare']:>8.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
