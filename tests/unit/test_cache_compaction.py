"""The local cache file stays proportional to the working set: rows of dropped entries leave
it, free pages go back to the filesystem, and a file made before that is converted once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conftest import StoreFactory

from localstate import StateStore
from localstate._cache.local_cache import LocalCache


def pragma(path: Path, name: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])


def row_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM state").fetchone()[0])


async def test_a_new_cache_file_vacuums_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    cache = await LocalCache.open(path, owner_id="t")
    await cache.close()
    assert pragma(path, "auto_vacuum") == 2  # INCREMENTAL
    assert pragma(path, "application_id") != 0


async def test_an_old_cache_file_is_converted_once_and_keeps_its_rows(
        open_store: StoreFactory, tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = await open_store(cache_path=path, flush_interval=3600.0)
    for i in range(50):
        await store.set("o", f"k{i}", i)
    await store.close()  # flushed: clean rows
    # what an older localstate made: the same file without auto_vacuum
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA auto_vacuum=NONE")
        conn.execute("VACUUM")
    assert pragma(path, "auto_vacuum") == 0
    rows = row_count(path)
    store = await open_store(cache_path=path, triggerer_id="third")
    assert pragma(path, "auto_vacuum") == 2
    assert row_count(path) == rows
    for i in range(50):
        assert await store.get("o", f"k{i}") == i
    await store.close()
    store = await open_store(cache_path=path, triggerer_id="fourth")  # converted once only
    assert pragma(path, "auto_vacuum") == 2


async def test_file_size_follows_the_working_set(open_store: StoreFactory,
                                                  tmp_path: Path) -> None:
    path = tmp_path / "churn.db"
    store = await open_store(cache_path=path, flush_interval=3600.0, max_keys_in_memory=100)
    big = "x" * 2000
    owners = [f"trigger:t:{i}" for i in range(3000)]
    for owner in owners:
        await store.set(owner, "watermark", big, durability="memory")
    await store.flush()  # all clean now: evicted down to about 100, their rows purged
    await store.sync_local()
    assert len(store.entry_table.entries) <= 110
    assert row_count(path) == len(store.entry_table.entries)
    pages = pragma(path, "page_count")
    # 3,000 rows of 2 KB took over 1,500 pages; what stays is the working set, plus room
    assert pages < 600, pages
    for owner in owners[:50]:  # released ones leave the file too
        await store.release(owner)
    await store.sync_local()
    assert row_count(path) == len(store.entry_table.entries)
    table = store.entry_table  # its owner index holds exactly its keys
    assert {(o, k) for o, keys in table.by_owner.items() for k in keys} == set(table.entries)
    stats = store.stats()
    assert stats.cache_file_bytes > 0
    assert stats.evictions >= 2890


async def test_stats_with_the_cache_off(tmp_path: Path, open_store: StoreFactory) -> None:
    store: StateStore = await open_store(enabled=False)
    assert store.stats().cache_file_bytes == 0
