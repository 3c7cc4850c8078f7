"""What each owner's history costs a flush, and that it stays within its bounds.

    python benches/bench_history.py                  # starts a throwaway PostgreSQL server
    python benches/bench_history.py --central-url postgresql://user@host/db
    python benches/bench_history.py --json docs/bench-history.json

1. Flush throughput, history on against off, in one run: flushes of N dirty keys (one
   watermark per owner, as watchers keep them) and flushes of N owners' events with their
   watermarks (`emit`). Three stores, one per mode: off, on (the default
   ``history_watermark_every``, its window counted in flush intervals: one flush per
   ``--flush-interval`` seconds) and on for every flush (``history_watermark_every = 0``),
   taking turns in each round so that drift of the machine weighs on all alike; the
   throughput of each over the whole run, and its ratio to off.
2. Churn: owners flushing over and over with a small bound (``history_max_rows``), a third
   of them emitting, and a twentieth of them handed over at each flush (claimed before their
   writes, released after the flush: a claim row and a release row each): the most rows any
   owner held after each flush, against the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from localstate import StateStore
from localstate._bench.report import machine_info
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.history import HistoryPolicy
from localstate._sync.central.schema import history


def _central(store: StateStore) -> CentralStore:
    central = store.central_store
    assert isinstance(central, CentralStore)
    return central


async def _flush_times(store: StateStore, owners: list[str], rounds: int, base: int,
                       events: bool) -> list[float]:
    times: list[float] = []
    for n in range(rounds):
        value = base + n * len(owners)
        for i, owner in enumerate(owners):
            if events:
                await store.emit(owner, {"n": value + i}, watermark=value + i,
                                 key=str(value + i), durability="memory")
            else:
                await store.set(owner, "watermark", value + i, durability="memory")
        await store.sync_local()  # the local commit is the local writer's work, not the flush's
        started = time.perf_counter()
        await store.flush()
        times.append(time.perf_counter() - started)
    return times


#: the modes measured: history off, on (the default window), on for every flush
MODES = {"off": None, "on": HistoryPolicy(),
         "every": HistoryPolicy(watermark_every=0.0)}


class _Clock:
    """The seconds the history's windows count: one `flush_interval` per flush, as a
    triggerer flushing every interval would see them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def on_against_off(url: str, folder: Path, keys: int, rounds: int, events: bool,
                         flush_interval: float) -> dict[str, Any]:
    """Flush throughput of `keys` owners per mode (`MODES`), over `rounds` flushes each, the
    modes taking turns in every round (in a rotating order)."""
    kind = "events" if events else "rows"
    times: dict[str, list[float]] = {m: [] for m in MODES}
    stores: dict[str, StateStore] = {}
    clock = _Clock()
    try:
        for mode, policy in MODES.items():
            store = await StateStore.open(
                cache_path=folder / f"{kind}-{keys}-{mode}.db", central_url=url,
                triggerer_id=f"hist-{mode}", flush_interval=3600.0,
                max_batch=max(keys, 10_000), central_thread=False)
            store.entry_table.kick_at = keys + 1  # no background flush while dirtying
            _central(store).use_history(policy or HistoryPolicy(enabled=False), clock)
            stores[mode] = store
        owners = {m: [f"trigger:hist:{kind}:{m}:{keys}:{i}" for i in range(keys)]
                  for m in stores}
        for mode, store in stores.items():  # first writes: the rows exist, as in steady state
            await _flush_times(store, owners[mode], 1, 0, events)
        order = list(MODES)
        for r in range(rounds):
            clock.now += flush_interval
            for mode in order[r % 3:] + order[:r % 3]:
                times[mode] += await _flush_times(stores[mode], owners[mode], 1,
                                                  (r + 1) * keys * 10, events)
    finally:
        for store in stores.values():
            await store.close()
    # throughput over the run: every flush counts, the ones that record the window's
    # watermarks too (a median would hide them)
    rate = {m: keys * len(t) / sum(t) for m, t in times.items()}
    row: dict[str, Any] = {"kind": kind, "keys": keys, "rounds": rounds,
                           "flush_interval_s": flush_interval}
    for m in MODES:
        row[f"{m}_rows_per_s"] = rate[m]
        row[f"{m}_median_s"] = statistics.median(times[m])
    row["on_vs_off"] = rate["on"] / rate["off"]
    row["every_vs_off"] = rate["every"] / rate["off"]
    print(f"flush of {keys:>6,} {kind:<6}: off {rate['off']:>9,.0f}/s  on {rate['on']:>9,.0f}/s "
          f"({row['on_vs_off']:.3f} of off)  every flush {rate['every']:>9,.0f}/s "
          f"({row['every_vs_off']:.3f} of off)", flush=True)
    return row


async def churn(url: str, folder: Path, owners: int, flushes: int, max_rows: int
                ) -> dict[str, Any]:
    """The most history rows any owner held after each of `flushes` flushes."""
    most, total, handovers = 0, 0, 0
    names = [f"trigger:churn:{i}" for i in range(owners)]
    async with StateStore(cache_path=folder / "churn.db", central_url=url,
                          triggerer_id="churn", flush_interval=3600.0,
                          central_thread=False) as store:
        central = _central(store)
        central.use_history(HistoryPolicy(max_rows=max_rows, watermark_every=0.0))
        for n in range(flushes):
            moving = [o for i, o in enumerate(names) if (n + i) % 20 == 0]
            for owner in moving:  # a handover: claimed here, released after the flush
                await store.claim(owner)
            for i, owner in enumerate(names):
                if (n + i) % 3 == 0:  # a third of them emit as well
                    await store.emit(owner, n, watermark=n, key=f"{n}")
                else:
                    await store.set(owner, "watermark", n)
            await store.flush()
            for owner in moving:
                assert (await store.release(owner)).recorded
            handovers += len(moving)
            counts = await central.run_read(
                select(func.count()).select_from(history).where(
                    history.c.owner.like("trigger:churn:%")).group_by(history.c.owner),
                "count history")
            most = max(most, *(int(c) for (c,) in counts))
            total = sum(int(c) for (c,) in counts)
    bound = max_rows + max(1, max_rows // 10)
    row = {"owners": owners, "flushes": flushes, "max_rows": max_rows,
           "handovers": handovers, "bound_with_slack": bound, "most_rows_held": most,
           "rows_at_end": total, "within_bound": most <= bound}
    print(f"churn: {owners} owners x {flushes} flushes, {handovers} handovers, "
          f"history_max_rows {max_rows}: at most {most} rows per owner (bound {bound}), "
          f"{total} rows at the end", flush=True)
    return row


def _command(args: argparse.Namespace) -> str:
    """The command line of this run, without ``--json`` (the page names the file)."""
    return (f"python benches/bench_history.py --sizes {','.join(map(str, args.sizes))} "
            f"--event-sizes {','.join(map(str, args.event_sizes))} --rounds {args.rounds}")


async def main_async(args: argparse.Namespace, url: str, folder: Path) -> dict[str, Any]:
    central = await CentralStore.open(url)
    await central.close()
    result: dict[str, Any] = {"central": central.url, "machine": machine_info(),
                              "command": _command(args), "flush": [], "churn": None}
    for keys in args.sizes:
        result["flush"].append(await on_against_off(url, folder, keys, args.rounds, False,
                                                    args.flush_interval))
    for keys in args.event_sizes:
        result["flush"].append(await on_against_off(url, folder, keys, args.rounds, True,
                                                    args.flush_interval))
    result["churn"] = await churn(url, folder, args.churn_owners, args.churn_flushes,
                                  args.churn_max_rows)
    result["load_at_end"] = round(os.getloadavg()[0], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--central-url", help="default: start a throwaway PostgreSQL server")
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1000, 10_000])
    parser.add_argument("--event-sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1000])
    parser.add_argument("--rounds", type=int, default=30,
                        help="flushes per size and mode")
    parser.add_argument("--flush-interval", type=float, default=1.0,
                        help="seconds the history's window counts per flush")
    parser.add_argument("--churn-owners", type=int, default=200)
    parser.add_argument("--churn-flushes", type=int, default=120)
    parser.add_argument("--churn-max-rows", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ls-history-") as tmp:
        folder = Path(tmp)
        server: Any = None
        url = args.central_url
        if url is None:
            from localstate._testing.postgres_server import PostgresServer

            server = PostgresServer(folder / "pg")
            server.start()
            url = server.url
        try:
            result = asyncio.run(main_async(args, url, folder))
        finally:
            if server is not None:
                server.close()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
