"""StateStore's public API, in every durability mode, on both central backends."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory, value_id

from localstate import (
    FlushState,
    InvalidInput,
    InvalidName,
    StateStore,
    StoreClosed,
    ValueEncodingError,
    ValueTooLarge,
    VersionConflict,
)

DURABILITIES = ["memory", "local", "central"]


def local_rows(path: Path) -> dict[tuple[str, str], tuple[Any, ...]]:
    """The cache file's rows, read with a separate sqlite3 connection."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT owner, key, value, version, synced_version FROM state"
        ).fetchall()
    conn.close()
    return {(r[0], r[1]): r[2:] for r in rows}


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_set_get_record_delete_in_each_mode(open_store: StoreFactory,
                                                  durability: str) -> None:
    store = await open_store(durability=durability)
    assert await store.get("dag:d/t", "cursor") is None
    assert await store.get("dag:d/t", "cursor", default=7) == 7
    v1 = await store.set("dag:d/t", "cursor", {"offset": 1})
    v2 = await store.set("dag:d/t", "cursor", {"offset": 2})
    assert (v1, v2) == (1, 2)
    assert await store.get("dag:d/t", "cursor") == {"offset": 2}
    rec = await store.record("dag:d/t", "cursor")
    assert rec is not None
    assert rec.value == {"offset": 2}
    assert rec.version == 2
    assert rec.updated_by == store.triggerer_id
    assert rec.updated_at.tzinfo is not None
    if durability == "central":
        assert rec.flush_state is FlushState.FLUSHED
        assert rec.central_version == 2
    else:
        assert rec.flush_state is FlushState.DIRTY
        await store.flush()
        rec = await store.record("dag:d/t", "cursor")
        assert rec is not None
        assert rec.flush_state is FlushState.FLUSHED
    assert await store.delete("dag:d/t", "cursor") is True
    assert await store.delete("dag:d/t", "cursor") is False
    assert await store.get("dag:d/t", "cursor", default="gone") == "gone"
    assert await store.record("dag:d/t", "cursor") is None


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_per_call_durability_overrides_the_store(open_store: StoreFactory,
                                                       durability: str) -> None:
    store = await open_store(durability="memory")
    await store.set("o", "k", 1, durability=durability)  # type: ignore[arg-type]
    if durability == "memory":
        await store.sync_local()
    # local and central: on disk when set() returned; memory: after the commit above
    assert local_rows(store.settings.resolved_cache_path)[("o", "k")][:2] == ("1", 1)


async def test_get_many_items_and_handles(open_store: StoreFactory) -> None:
    store = await open_store()
    for i in range(5):
        await store.set("asset_watcher:orders", f"k{i}", i)
    await store.set("asset_watcher:other", "k0", "x")
    assert await store.get_many("asset_watcher:orders", ["k1", "k3", "missing"]) == {
        "k1": 1, "k3": 3}
    records = [r async for r in store.items("asset_watcher:orders")]
    assert [(r.key, r.value) for r in records] == [(f"k{i}", i) for i in range(5)]
    sv = store.variable("watermark", owner="asset_watcher:orders")
    assert await sv.get(default=0) == 0
    assert await sv.set(10) == 1
    assert await sv.get() == 10
    assert await sv.compare_and_set(11, expected_version=1) == 2
    rec = await sv.record()
    assert rec is not None
    assert rec.value == 11


async def test_compare_and_set(open_store: StoreFactory) -> None:
    store = await open_store()
    assert await store.compare_and_set("o", "k", "a", expected_version=0) == 1
    with pytest.raises(VersionConflict) as info:
        await store.compare_and_set("o", "k", "b", expected_version=0)
    assert (info.value.expected, info.value.actual) == (0, 1)
    assert await store.get("o", "k") == "a"
    assert await store.compare_and_set("o", "k", "b", expected_version=1) == 2
    with pytest.raises(InvalidInput):
        await store.compare_and_set("o", "k", "c", expected_version="2")  # type: ignore[arg-type]


async def test_a_value_the_caller_mutates_does_not_change_what_is_stored(
    open_store: StoreFactory,
) -> None:
    store = await open_store()
    value: dict[str, Any] = {"ids": [1, 2]}
    await store.set("o", "k", value)
    value["ids"].append(3)
    got = await store.get("o", "k")
    assert got == {"ids": [1, 2]}
    got["ids"].append(99)
    assert await store.get("o", "k") == {"ids": [1, 2]}


@dataclass
class Offset:
    partition: int
    offset: int


async def test_values_come_back_as_json_decodes_them(open_store: StoreFactory) -> None:
    store = await open_store()
    at = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
    await store.set("o", "when", at)
    await store.set("o", "offset", Offset(3, 42))
    await store.set("o", "tuple", (1, "a"))
    await store.set("o", "null", None)
    assert await store.get("o", "when") == "2026-12-02T12:00:00+00:00"
    assert await store.get("o", "offset") == {"partition": 3, "offset": 42}
    assert await store.get("o", "tuple") == [1, "a"]
    assert await store.get("o", "null", default="default") is None


BAD_NAMES = ["", "x" * 251, "bad\nname", "nul\x00", "tab\t", "\x7f", "\ud800"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("which", ["owner", "key"])
async def test_bad_names_are_refused_and_nothing_is_written(
    open_store: StoreFactory, name: str, which: str
) -> None:
    store = await open_store()
    owner, key = (name, "k") if which == "owner" else ("o", name)
    with pytest.raises(InvalidName, match=which):
        await store.set(owner, key, 1)
    with pytest.raises(InvalidName):
        await store.get(owner, key)
    assert store.stats().sets == 0
    assert store.stats().dirty_keys == 0
    await store.flush()
    assert local_rows(store.settings.resolved_cache_path) == {}


BAD_VALUES: list[Any] = [
    float("nan"), float("inf"), -float("inf"), [1, float("nan")], {"a": {"b": float("inf")}},
    object(), {1: "non-str key"}, 2**64, b"bytes", {1, 2},
]


@pytest.mark.parametrize("value", BAD_VALUES, ids=value_id)
async def test_bad_values_are_refused_and_nothing_is_written(
    open_store: StoreFactory, value: Any
) -> None:
    store = await open_store()
    await store.set("o", "k", "before")
    with pytest.raises(ValueEncodingError):
        await store.set("o", "k", value)
    assert await store.get("o", "k") == "before"
    assert (await store.record("o", "k")).version == 1  # type: ignore[union-attr]


async def test_values_over_the_size_limit_are_refused(open_store: StoreFactory) -> None:
    store = await open_store(max_value_bytes=1024)
    with pytest.raises(ValueTooLarge) as info:
        await store.set("o", "k", "x" * 2000)
    assert info.value.limit == 1024
    assert info.value.size == 2002
    assert await store.get("o", "k") is None
    await store.set("o", "k", "x" * 1000)


async def test_bad_durability_is_refused_before_writing(open_store: StoreFactory) -> None:
    store = await open_store()
    with pytest.raises(InvalidInput, match="durability"):
        await store.set("o", "k", 1, durability="disk")  # type: ignore[arg-type]
    assert await store.get("o", "k") is None
    assert store.stats().dirty_keys == 0


async def test_calls_after_close_raise_and_close_is_safe_twice(
    open_store: StoreFactory,
) -> None:
    store = await open_store()
    await store.set("o", "k", 1)
    await store.close()
    await store.close()
    for call in (store.get("o", "k"), store.set("o", "k", 2), store.delete("o", "k"),
                 store.record("o", "k"), store.flush()):
        with pytest.raises(StoreClosed):
            await call


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_reopen_restores_every_write(open_store: StoreFactory, tmp_path: Path,
                                           central_url: str, durability: str) -> None:
    cache = tmp_path / "reopen.db"
    store = await StateStore.open(cache_path=cache, central_url=central_url,
                                  triggerer_id="t", durability=durability,
                                  flush_interval=60.0)
    for i in range(50):
        await store.set(f"o{i % 5}", f"k{i}", i)
    await store.close()
    again = await StateStore.open(cache_path=cache, central_url=central_url,
                                  triggerer_id="t", flush_interval=60.0)
    try:
        for i in range(50):
            assert await again.get(f"o{i % 5}", f"k{i}") == i
        assert again.stats().dirty_keys == 0  # close() flushed them
        assert again.stats().read_through_queries == 0  # all served from the cache file
    finally:
        await again.close()


async def test_a_thousand_coroutines_writing_distinct_and_shared_keys(
    open_store: StoreFactory,
) -> None:
    store = await open_store(durability="local")
    writes_per_task = 20
    seen: dict[tuple[str, str], list[int]] = {}

    async def writer(i: int) -> None:
        for n in range(writes_per_task):
            v = await store.set(f"trigger:x:{i}", "watermark", n)
            seen.setdefault((f"trigger:x:{i}", "watermark"), []).append(v)
            v = await store.set("shared", f"key{i % 10}", [i, n])
            seen.setdefault(("shared", f"key{i % 10}"), []).append(v)

    await asyncio.gather(*(writer(i) for i in range(1000)))
    for (owner, key), versions in seen.items():
        if owner == "shared":
            continue
        assert versions == list(range(1, writes_per_task + 1))
        assert await store.get(owner, key) == writes_per_task - 1
    for i in range(10):
        versions = seen[("shared", f"key{i}")]
        # 100 tasks x 20 writes each: every write got its own version, none lost
        assert sorted(versions) == list(range(1, 100 * writes_per_task + 1))
        rec = await store.record("shared", f"key{i}")
        assert rec is not None
        assert rec.version == 100 * writes_per_task
    stats = store.stats()
    # group commit: the 40,000 local writes shared commits
    assert stats.local_commits < 40_000 / 10
    assert stats.sets == 40_000
    report = await store.flush()
    assert report.written == 1010
    assert store.stats().dirty_keys == 0


async def test_stats_report_activity(open_store: StoreFactory) -> None:
    store = await open_store()
    await store.set("o", "k", 1)
    await store.get("o", "k")
    await store.get("o", "missing")
    s = store.stats()
    assert (s.sets, s.gets, s.cache_hits) == (1, 2, 1)
    assert s.dirty_keys == 1
    assert s.oldest_unflushed_s >= 0
    assert s.last_flush_at is None
    # the set's local commit was timed (durability = local: the set waited for it)
    assert s.local_commits == 1
    assert s.local_commit_p99_s is not None
    assert 0 < s.local_commit_p99_s < 60
    await store.flush()
    s = store.stats()
    assert s.dirty_keys == 0
    assert s.flushes == 1
    assert s.central_rows == 1
    assert s.last_flush_at is not None
    assert s.flush_lag_p50_s is not None
    assert s.as_dict()["sets"] == 1


async def test_class_level_state_variable_on_the_default_store(
    open_store: StoreFactory,
) -> None:
    from localstate import StateVariable

    store = await open_store()
    StateVariable.configure(store)
    try:
        await StateVariable.set("watermark", 5, owner="asset_watcher:a")
        assert await StateVariable.get("watermark", owner="asset_watcher:a") == 5
        assert await store.get("asset_watcher:a", "watermark") == 5
        assert await StateVariable.get("nope", owner="asset_watcher:a", default=1) == 1
        assert await StateVariable.delete("watermark", owner="asset_watcher:a") is True
    finally:
        StateVariable.configure(None)


async def test_default_store_opens_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localstate import StateVariable

    monkeypatch.setenv("AIRFLOW__LOCALSTATE__CENTRAL_URL", f"sqlite:///{tmp_path}/env.db")
    monkeypatch.setenv("AIRFLOW__LOCALSTATE__TRIGGERER_ID", "from-env")
    StateVariable.configure(None)
    try:
        await StateVariable.set("k", "v", owner="o")
        store = StateVariable.default_store()
        assert store is not None
        assert store.triggerer_id == "from-env"
        assert store.settings.resolved_cache_path == (
            Path(str(tmp_path / "airflow-home")) / "localstate" / "from-env.db")
        await store.close()
    finally:
        StateVariable.configure(None)
