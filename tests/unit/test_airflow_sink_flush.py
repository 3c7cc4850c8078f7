"""Issue #20 with the `airflow` sink: a flush pipelines its accessor calls and is bounded, taking
the oldest dirty keys first; a first `set` in local durability never waits for a read-through;
cache misses share one round of pipelined reads.

`GatedAccessor` counts the calls it is running at once: each call yields to the loop a few
times before it answers, as a request to the triggerer's supervisor does, so calls made one
after another never overlap and pipelined ones do. Its reads can be held (`reads_open`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio

from localstate import StateStore
from localstate._sync.sinks.airflow_sink import AirflowSink
from localstate.errors import CentralUnavailable, reason

OWNER = "asset_watcher:orders"


class GatedAccessor:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.running = 0
        self.most_at_once = 0
        self.reads_open = asyncio.Event()
        self.reads_open.set()
        self.read_started = asyncio.Event()

    async def _answer(self, op: str, key: str) -> None:
        self.calls.append((op, key))
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            for _ in range(3):  # a round trip through the supervisor: a few loop turns
                await asyncio.sleep(0)
        finally:
            self.running -= 1

    async def aget(self, key: str, default: Any = None) -> Any:
        self.read_started.set()
        await self.reads_open.wait()
        await self._answer("get", key)
        return json.loads(self.values[key]) if key in self.values else default

    async def aset(self, key: str, value: Any) -> None:
        await self._answer("set", key)
        self.values[key] = json.dumps(value)

    async def adelete(self, key: str) -> None:
        await self._answer("delete", key)
        self.values.pop(key, None)


@pytest_asyncio.fixture
async def accessor() -> GatedAccessor:
    return GatedAccessor()


@pytest_asyncio.fixture
async def sink(accessor: GatedAccessor) -> AirflowSink:
    sink = AirflowSink()
    sink.registry.register(OWNER, [accessor])
    return sink


@pytest_asyncio.fixture
async def store(sink: AirflowSink, tmp_path: Path) -> AsyncIterator[StateStore]:
    s = await StateStore.open(cache_path=tmp_path / "cache.db", sink=sink, flush_interval=60,
                              durability="local", conflict_policy="asset_watcher:*=max")
    yield s
    await s.close()


async def test_a_flush_pipelines_its_calls(store: StateStore, accessor: GatedAccessor,
                                           sink: AirflowSink) -> None:
    """Defect 1: one aget and one aset per key, one key after another."""
    for n in range(40):
        await store.set(OWNER, f"wm{n}", n)
    report = await store.flush()
    assert report.written == 40
    assert {k: json.loads(v) for k, v in accessor.values.items()} == {
        f"wm{n}": n for n in range(40)}
    # the max policy's read-compare-write is kept: one read and one write per key
    assert sorted(op for op, _ in accessor.calls).count("get") == 40
    assert 1 < accessor.most_at_once <= sink.in_flight


async def test_a_flush_over_budget_leaves_the_newest_keys_for_the_next(
    store: StateStore, accessor: GatedAccessor, sink: AirflowSink,
) -> None:
    sink.flush_budget = 0.0  # past at once: each lane writes its one row
    sink.in_flight = 2
    for n in range(5):
        await store.set(OWNER, f"wm{n}", n)
    assert (await store.flush()).written == 2
    assert sorted(accessor.values) == ["wm0", "wm1"]  # the oldest first
    await store.set(OWNER, "wm0", 10)  # dirty again: now the newest
    assert (await store.flush()).written == 2
    assert sorted(accessor.values) == ["wm0", "wm1", "wm2", "wm3"]
    assert (await store.flush()).written == 2
    assert json.loads(accessor.values["wm0"]) == 10
    assert sink.deferred == 3 + 2
    assert store.stats().dirty_keys == 0


async def test_keys_written_again_during_a_flush_go_behind_the_others(
    store: StateStore, accessor: GatedAccessor, sink: AirflowSink,
) -> None:
    """A watermark set again while its flush is out is dirty again; it must queue behind the
    keys that flush had no time for, or a few hot keys take every flush and the rest starve
    (seen at 200 watchers: a flush lag p99 of 60 s, the length of the run)."""
    sink.flush_budget = 0.0  # each flush writes one row per lane
    sink.in_flight = 2
    for n in range(6):
        await store.set(OWNER, f"wm{n}", n)
    accessor.reads_open.clear()
    flushing = asyncio.ensure_future(store.flush())
    await accessor.read_started.wait()  # wm0 and wm1 are out
    await store.set(OWNER, "wm0", 10)
    await store.set(OWNER, "wm1", 11)
    accessor.reads_open.set()
    await flushing
    assert [k for op, k in accessor.calls if op == "set"] == ["wm0", "wm1"]
    accessor.calls.clear()
    await store.flush()
    assert [k for op, k in accessor.calls if op == "set"] == ["wm2", "wm3"]
    accessor.calls.clear()
    await store.flush()
    assert [k for op, k in accessor.calls if op == "set"] == ["wm4", "wm5"]
    accessor.calls.clear()
    await store.flush()
    assert [k for op, k in accessor.calls if op == "set"] == ["wm0", "wm1"]
    assert {k: json.loads(v) for k, v in accessor.values.items()} == {
        "wm0": 10, "wm1": 11, "wm2": 2, "wm3": 3, "wm4": 4, "wm5": 5}


async def test_a_first_local_set_does_not_wait_for_a_read(
    store: StateStore, accessor: GatedAccessor,
) -> None:
    """Defect 2: the first set of a key read it through first (one aget, here held)."""
    accessor.values["watermark"] = "3"  # written by another triggerer: max keeps the greater
    accessor.reads_open.clear()
    setting = asyncio.ensure_future(store.set(OWNER, "watermark", 7))
    read = asyncio.ensure_future(accessor.read_started.wait())
    await asyncio.wait([setting, read], return_when=asyncio.FIRST_COMPLETED)
    read.cancel()
    assert setting.done(), "the set waited for a read of Airflow's store"
    assert not accessor.read_started.is_set()
    accessor.reads_open.set()
    report = await store.flush()  # the flush settles the unknown base with max
    assert report.written == 1
    assert json.loads(accessor.values["watermark"]) == 7
    await store.set(OWNER, "low", 1)
    accessor.values["low"] = "5"  # another triggerer's greater value wins the flush
    assert (await store.flush()).adopted == 1
    assert await store.get(OWNER, "low") == 5


async def test_misses_share_one_round_of_pipelined_reads(
    store: StateStore, accessor: GatedAccessor,
) -> None:
    for n in range(30):
        accessor.values[f"wm{n}"] = str(n)
    got = await asyncio.gather(*(store.get(OWNER, f"wm{n}") for n in range(30)))
    assert got == list(range(30))
    assert [op for op, _ in accessor.calls] == ["get"] * 30
    assert accessor.most_at_once > 1
    assert store.stats().read_through_queries <= 2


def test_a_warning_names_a_timeout() -> None:
    """Issue #14: the cleanup warning read "()" — ``str(TimeoutError())`` is empty."""
    assert reason(asyncio.TimeoutError()) == "TimeoutError"
    assert reason(CentralUnavailable("the supervisor is gone")) == "the supervisor is gone"
