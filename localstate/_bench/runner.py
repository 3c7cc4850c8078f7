"""The write-throughput benchmark: K triggers in hot loops, each mode on the same central DB.

A *trigger* is an asyncio task setting its own watermark (``trigger:bench:<i>`` /
``watermark``) in a loop, optionally sleeping a "poll" delay between sets. In the shared-key
scenario the triggers share a few keys instead. Each mode runs for `duration` seconds:

* ``direct``   the cache off: one central transaction per set (today's ``Variable.set``);
* ``memory`` / ``local`` / ``central``: local-first in that durability;
* ``bare``     an ``await`` of a coroutine that sets a dict: the ceiling of any store.

Central transactions are counted by a SQLAlchemy ``commit`` event on the store's engine, not by
the store's own counters.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from array import array
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event

from localstate._bench.child_process import rss_bytes
from localstate._bench.percentile import percentile
from localstate._bench.progress import Progress
from localstate._store import StateStore

__all__ = ["STORE_MODES", "BenchConfig", "BenchRow", "rss_mb", "run_scenario"]

STORE_MODES = ("direct", "memory", "local", "central")


@dataclass
class BenchConfig:
    central_url: str | None = None
    duration: float = 2.0
    triggers: list[int] = field(default_factory=lambda: [1, 100, 1000])
    modes: list[str] = field(default_factory=lambda: ["bare", *STORE_MODES])
    poll_delay: float = 0.0
    #: also run the shared-key scenario (max(triggers) triggers on `shared_keys` keys)
    shared: bool = True
    shared_keys: int = 8
    flush_interval: float = 1.0
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ls-bench-")))
    progress: bool = True
    #: the ``flush_airflow`` row (a real ``airflow triggerer``): None runs it when Airflow is
    #: installed and the central DB is PostgreSQL; True also on a throwaway PostgreSQL
    airflow_sink: bool | None = None
    #: dirty keys that row flushes
    airflow_keys: int = 1000

    @property
    def url(self) -> str:
        return self.central_url or f"sqlite:///{self.folder / 'central.db'}"


@dataclass
class BenchRow:
    scenario: str
    mode: str
    triggers: int
    sets: int = 0
    seconds: float = 0.0
    sets_per_s: float = 0.0
    set_p50_ms: float | None = None
    set_p99_ms: float | None = None
    set_max_ms: float | None = None
    central_txns: int = 0
    central_txns_per_s: float = 0.0
    central_rows: int = 0
    rows_per_txn: float | None = None
    lag_p50_ms: float | None = None
    lag_p99_ms: float | None = None
    rss_mb: float = 0.0
    cache_mb: float | None = None
    x_direct: float | None = None
    x_bare: float | None = None
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def rss_mb() -> float:
    return rss_bytes() / 2**20


def _pct(samples: array[float] | list[float], q: float) -> float | None:
    """`percentile` of `samples` (seconds) in milliseconds; None when there are none."""
    return percentile(samples, q) * 1000.0 if samples else None


SetFn = Callable[[str, str, int], Awaitable[Any]]


async def _hammer(set_fn: SetFn, keys: list[tuple[str, str]], duration: float,
                  poll_delay: float) -> tuple[int, float, array[float]]:
    """Each (owner, key) is one trigger's watermark: set it in a loop for `duration` s.

    Returns (acknowledged sets, elapsed seconds, latency samples in seconds). A set that does not
    suspend never lets the loop run, so each trigger yields every 16 sets (every set when
    polling), the same in every mode: a trigger awaits its source between updates, and with
    10,000 triggers yielding only every 64 sets one turn of the loop took a second, starving
    the sync worker's flush of turns.
    """
    latencies: array[float] = array("d")
    deadline = time.perf_counter() + duration
    counts = [0] * len(keys)
    clock = time.perf_counter
    yield_every = 1 if poll_delay else 16

    async def trigger(i: int, owner: str, key: str) -> None:
        n = 0
        lat = latencies
        while True:
            t0 = clock()
            if t0 >= deadline:
                break
            await set_fn(owner, key, n)
            lat.append(clock() - t0)
            n += 1
            if n % yield_every == 0:
                await asyncio.sleep(poll_delay)
        counts[i] = n

    started = clock()
    await asyncio.gather(*(trigger(i, o, k) for i, (o, k) in enumerate(keys)))
    return sum(counts), clock() - started, latencies


def _keys(scenario: str, mode: str, triggers: int, shared: int) -> list[tuple[str, str]]:
    if scenario == "shared":
        return [(f"bench:shared:{mode}", f"key{i % shared}") for i in range(triggers)]
    return [(f"trigger:bench:{mode}:{triggers}:{i}", "watermark") for i in range(triggers)]


async def run_scenario(cfg: BenchConfig, scenario: str, mode: str, triggers: int,
                       progress: Progress | None = None) -> BenchRow:
    row = BenchRow(scenario=scenario, mode=mode, triggers=triggers)
    keys = _keys(scenario, mode, triggers, cfg.shared_keys)
    if mode == "bare":
        target: dict[tuple[str, str], int] = {}

        async def bare_set(owner: str, key: str, value: int) -> None:
            target[owner, key] = value

        row.sets, row.seconds, lat = await _hammer(bare_set, keys, cfg.duration, cfg.poll_delay)
    else:
        row, lat = await _run_store(cfg, row, keys)
    row.sets_per_s = row.sets / row.seconds if row.seconds else 0.0
    row.set_p50_ms, row.set_p99_ms = _pct(lat, 0.5), _pct(lat, 0.99)
    row.set_max_ms = max(lat) * 1000.0 if lat else None
    row.rss_mb = rss_mb()
    if progress is not None:
        progress.step(f"{scenario} {mode} K={triggers}: {row.sets_per_s:,.0f} sets/s")
    return row


async def _run_store(cfg: BenchConfig, row: BenchRow, keys: list[tuple[str, str]]
                     ) -> tuple[BenchRow, array[float]]:
    cache = cfg.folder / f"cache-{row.scenario}-{row.mode}-{row.triggers}.db"
    store = await StateStore.open(
        cache_path=cache, central_url=cfg.url, triggerer_id=f"bench-{row.mode}",
        durability="local" if row.mode == "direct" else row.mode,
        enabled=row.mode != "direct", flush_interval=cfg.flush_interval,
        max_batch=max(10_000, len(keys)), central_timeout=120.0,
    )
    try:
        if row.mode != "direct":
            # warm-up, not measured: each trigger's first set reads its key through
            await asyncio.gather(*(store.set(o, k, -1, durability="memory")
                                   for o, k in set(keys)))
            await store.flush()
        sink = store.central_store
        assert sink is not None
        commits = [0]

        def on_commit(_conn: Any) -> None:
            commits[0] += 1

        event.listen(sink.engine.sync_engine, "commit", on_commit)
        rows_before = sink.rows_written
        worker = store.sync_worker
        if worker is not None:
            worker.lags.clear()  # only the flushes of the measured window

        async def store_set(owner: str, key: str, value: int) -> None:
            await store.set(owner, key, value)

        row.sets, row.seconds, lat = await _hammer(store_set, keys, cfg.duration,
                                                   cfg.poll_delay)
        row.central_txns = commits[0]
        row.central_rows = sink.rows_written - rows_before
        event.remove(sink.engine.sync_engine, "commit", on_commit)
        row.central_txns_per_s = row.central_txns / row.seconds if row.seconds else 0.0
        row.rows_per_txn = row.central_rows / row.central_txns if row.central_txns else None
        if worker is not None:
            lags = list(worker.lags)
            row.lag_p50_ms, row.lag_p99_ms = _pct(lags, 0.5), _pct(lags, 0.99)
        else:
            row.lag_p50_ms = row.lag_p99_ms = 0.0  # direct: in the DB before the set returns
        if row.mode != "direct":
            row.cache_mb = sum(
                p.stat().st_size for p in cache.parent.glob(cache.name + "*")
                if p.suffix != ".lock"
            ) / 2**20
    finally:
        await store.close()
    return row, lat
