"""`AirflowSink` with a store: coalescing, read-through, the max policy's read-compare-write,
owners without an accessor, and an accessor that fails.

The accessor here is `DictAccessor`, an in-memory class with the three methods the sink calls
on Airflow's ``AssetStateStoreAccessor`` (which needs a triggerer's supervisor socket; the real
one is exercised by `tests/airflow/test_airflow_e2e.py`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from dict_accessor import DictAccessor

from localstate import StateStore
from localstate._core.config import Settings
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow
from localstate._sync.sinks.airflow_sink import AirflowSink, process_sink
from localstate.errors import CentralUnavailable, ConfigError

OWNER = "asset_watcher:orders"


@pytest.fixture
def accessor() -> DictAccessor:
    return DictAccessor()


@pytest.fixture
def sink(accessor: DictAccessor) -> AirflowSink:
    sink = AirflowSink()
    sink.registry.register(OWNER, [accessor])
    return sink


@pytest_asyncio.fixture
async def store(sink: AirflowSink, tmp_path: Path) -> AsyncIterator[StateStore]:
    s = await StateStore.open(cache_path=tmp_path / "cache.db", sink=sink, flush_interval=60,
                              conflict_policy="asset_watcher:*=max, *=reject")
    yield s
    await s.close()


def sets(accessor: DictAccessor) -> int:
    return sum(1 for op, _ in accessor.calls if op == "set")


async def test_coalesced_one_call_per_dirty_key(store: StateStore, accessor: DictAccessor
                                                ) -> None:
    for n in range(1, 2001):
        await store.set(OWNER, "watermark", n, durability="memory")
        await store.set(OWNER, "cursor", {"page": n}, durability="memory")
    report = await store.flush()
    assert report.written == 2
    assert sets(accessor) == 2
    assert json.loads(accessor.values["watermark"]) == 2000
    assert json.loads(accessor.values["cursor"]) == {"page": 2000}
    await store.delete(OWNER, "cursor")
    await store.flush()
    assert "cursor" not in accessor.values


async def test_miss_reads_through_with_aget(store: StateStore, accessor: DictAccessor) -> None:
    accessor.values["watermark"] = "41"
    assert await store.get(OWNER, "watermark") == 41
    assert ("get", "watermark") in accessor.calls
    await store.set(OWNER, "watermark", 42)
    await store.flush()
    assert accessor.values["watermark"] == "42"


async def test_max_never_lowers_what_airflow_holds(store: StateStore, accessor: DictAccessor
                                                   ) -> None:
    await store.set(OWNER, "watermark", 10)
    await store.flush()
    accessor.values["watermark"] = "500"  # another triggerer moved it on meanwhile
    await store.set(OWNER, "watermark", 300)
    report = await store.flush()
    assert report.conflicts == 1
    assert accessor.values["watermark"] == "500"
    assert await store.get(OWNER, "watermark") == 500  # the greater value is adopted
    await store.set(OWNER, "watermark", 501)
    await store.flush()
    assert accessor.values["watermark"] == "501"


async def test_max_skips_writing_an_equal_value(store: StateStore, accessor: DictAccessor
                                                ) -> None:
    accessor.values["watermark"] = "7"
    await store.set(OWNER, "watermark", 7)
    await store.flush()
    assert sets(accessor) == 0


_SEQUENCE_POLICIES = ["reject", "last_writer_wins", "max", "max:int", "max:text"]
_FIELD_POLICIES = ["reject", "max", "max:offset", "max:offset:int", "max:offset:text"]
_SEQUENCES = [
    *[pytest.param(p, ["8", "9", "10", "11", "2"], id=f"{p}-strings")
      for p in _SEQUENCE_POLICIES],
    *[pytest.param(p, [{"offset": s} for s in ("9", "10", "3")], id=f"{p}-fields")
      for p in _FIELD_POLICIES],
    pytest.param("max", [{"a": 1}, {"b": 2}], id="max-objects"),
]


@pytest.mark.parametrize(("policy", "values"), _SEQUENCES)
async def test_every_sequential_write_of_one_writer_lands_in_airflow(
    sink: AirflowSink, accessor: DictAccessor, tmp_path: Path, policy: str, values: list[Any],
) -> None:
    """Issue #23 through Airflow's store: "10" after "9" under max was refused (text order)
    and the watermark stuck. Airflow keeps no writer: the record the sink wrote last is its
    own, and its sequential writes on top of it land whatever the order."""
    store = await StateStore.open(cache_path=tmp_path / "seq.db", sink=sink, flush_interval=60,
                                  conflict_policy=f"asset_watcher:*={policy}")
    other = AirflowSink()  # another triggerer reading the same Airflow store
    other.registry.register(OWNER, [accessor])
    try:
        for value in values:
            await store.set(OWNER, "wm", value)
            report = await store.flush()
            assert (report.written, report.conflicts) == (1, 0)
            assert await store.get(OWNER, "wm") == value
            assert json.loads(accessor.values["wm"]) == value
            row = (await other.read_many([(OWNER, "wm")]))[(OWNER, "wm")]
            assert json.loads(row.data or "") == value
    finally:
        await store.close()


@pytest.mark.parametrize(("policy", "low", "high", "lower"), [
    ("max:int", "9", "10", "3"),
    ("max:text", "10", "9", "1"),
    ("max:timestamp", "2024-01-02T00:30:00+02:00", "2024-01-01T23:00:00Z", "2020-01-01"),
    ("max:offset:int", {"offset": "9"}, {"offset": 10}, {"offset": "3"}),
])
async def test_two_triggerers_on_one_airflow_store_keep_the_greater_value(
    accessor: DictAccessor, tmp_path: Path, policy: str, low: Any, high: Any, lower: Any,
) -> None:
    """Two triggerer processes (each its own sink) share Airflow's table. b, which took
    a's value over, may not lower it; a, which wrote it, moves it on, even down."""
    stores = []
    for name in ("a", "b"):
        sink = AirflowSink()
        sink.registry.register(OWNER, [accessor])
        stores.append(await StateStore.open(
            cache_path=tmp_path / f"{name}.db", sink=sink, flush_interval=60,
            triggerer_id=name, conflict_policy=policy))
    a, b = stores
    try:
        await a.set(OWNER, "wm", high)
        await a.flush()
        await b.set(OWNER, "wm", low)  # a zombie: reads a's value through, writes a lower one
        report = await b.flush()
        assert (report.adopted, report.conflicts) == (1, 1)
        assert await b.get(OWNER, "wm") == high
        await b.set(OWNER, "wm", lower)  # based on a's record, which b adopted: still refused
        assert (await b.flush()).conflicts == 1
        assert json.loads(accessor.values["wm"]) == high
        await a.set(OWNER, "wm", lower)  # a's own sequential write on its record: lands
        assert (await a.flush()).conflicts == 0
        assert json.loads(accessor.values["wm"]) == lower
        await b.set(OWNER, "wm", low)  # greater than a's value now: b's write goes in
        assert (await b.flush()).conflicts == 0
        assert json.loads(accessor.values["wm"]) == low
        await a.set(OWNER, "wm", lower)  # a is not the last writer any more: refused
        assert (await a.flush()).conflicts == 1
        assert json.loads(accessor.values["wm"]) == low
    finally:
        for store in stores:
            await store.close()


async def test_owner_without_accessor_waits_for_one(store: StateStore, sink: AirflowSink
                                                    ) -> None:
    await store.set("asset_watcher:later", "watermark", 5)
    report = await store.flush()
    assert report.retried == 1
    assert store.stats().dirty_keys == 1
    late = DictAccessor()
    sink.registry.register("asset_watcher:later", [late])
    await store.flush()
    assert late.values == {"watermark": "5"}
    assert store.stats().dirty_keys == 0


async def test_failing_accessor_keeps_the_write(store: StateStore, accessor: DictAccessor
                                                ) -> None:
    accessor.down = True
    await store.set(OWNER, "watermark", 9)
    with pytest.raises(CentralUnavailable, match="supervisor socket closed"):
        await store.flush()
    assert store.stats().dirty_keys == 1
    accessor.down = False
    await store.flush()
    assert accessor.values["watermark"] == "9"


async def test_several_accessors_each_get_the_value(accessor: DictAccessor) -> None:
    second = DictAccessor()
    sink = AirflowSink()
    sink.registry.register("trigger:x:1", [accessor, second])
    rows = [DirtyRow("trigger:x:1", "watermark", "3", 1, 0, 0.0, "t")]
    outcomes = await sink.write_batch(rows, PolicyMap("reject"))
    assert [o.resolution for o in outcomes] == ["written"]
    assert accessor.values == second.values == {"watermark": "3"}
    assert sink.transactions == 2


@pytest.mark.parametrize(("raw", "source"), [("kafka", "environment"), ("", "environment")])
def test_bad_sink_setting_names_it(raw: str, source: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.resolve(environ={"AIRFLOW__LOCALSTATE__SINK": raw})
    message = str(info.value)
    assert "'sink'" in message
    assert source in message
    assert "sql, airflow" in message


async def test_sink_setting_selects_the_process_airflow_sink(tmp_path: Path) -> None:
    store = await StateStore.open(cache_path=tmp_path / "c.db", sink="airflow")
    try:
        assert store.sink is process_sink()
        assert store.central_store is None  # no SQL central store, no thread
        assert store.settings.sources["sink"] == "argument"
    finally:
        await store.close()


async def test_cache_off_goes_straight_to_airflow(sink: AirflowSink, accessor: DictAccessor,
                                                  tmp_path: Path) -> None:
    store = await StateStore.open(cache_path=tmp_path / "off.db", sink=sink, enabled=False)
    try:
        for n in range(1, 4):
            await store.set(OWNER, "watermark", n)
        assert sets(accessor) == 3  # what Airflow does today: one call per set
        accessor.values["watermark"] = "10"
        assert await store.get(OWNER, "watermark") == 10
        with pytest.raises(CentralUnavailable, match="no Airflow asset state store accessor"):
            await store.set("asset_watcher:unknown", "watermark", 1)
    finally:
        await store.close()


async def test_one_failing_asset_does_not_hold_back_the_others(
    store: StateStore, sink: AirflowSink, accessor: DictAccessor
) -> None:
    gone = DictAccessor()
    gone.down = True  # e.g. an asset deactivated since: Airflow refuses its writes
    sink.registry.register("asset_watcher:gone", [gone])
    await store.set("asset_watcher:gone", "watermark", 1)
    await store.set(OWNER, "watermark", 2)
    report = await store.flush()
    assert (report.written, report.retried) == (1, 1)
    assert accessor.values == {"watermark": "2"}
    assert store.stats().dirty_keys == 1
