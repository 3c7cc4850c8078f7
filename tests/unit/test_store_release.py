"""`StateStore.release(owner)`: an owner that left is flushed, then dropped from memory and
from the cache file once the central DB holds it; nothing written meanwhile is lost."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import StoreFactory
from test_store_versions import HeldReads

from localstate import StateStore
from localstate._cache.entry import StateKey
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate._sync.central.central_store import CentralStore
from localstate.errors import InvalidName, StoreClosed

OWNER = "trigger:tests.Release:abc"


class HeldFlushes(HeldReads):
    """A sink around a `CentralStore` whose next `write_batch` can be held after the central
    DB has committed it (before the store hears back)."""

    def __init__(self, inner: CentralStore) -> None:
        super().__init__(inner)
        self.flush_hold: asyncio.Event | None = None
        self.written = asyncio.Event()

    async def write_batch(self, rows: Sequence[DirtyRow], policies: PolicyMap, **kw: Any
                          ) -> list[FlushOutcome]:
        outcomes = await self.inner.write_batch(rows, policies, **kw)
        hold, self.flush_hold = self.flush_hold, None  # holds one flush
        if hold is not None:
            self.written.set()
            await hold.wait()
        return outcomes


def file_keys(store: StateStore) -> set[tuple[str, str]]:
    """The keys the store's cache file holds (read with a connection of its own)."""
    with sqlite3.connect(store.settings.resolved_cache_path) as conn:
        return {(o, k) for o, k in conn.execute("SELECT owner, key FROM state")}


async def central_row(url: str, k: StateKey) -> CentralRow | None:
    central = await CentralStore.open(url)
    try:
        return (await central.read_many([k])).get(k)
    finally:
        await central.close()


async def test_release_flushes_then_drops_from_memory_and_file(
        open_store: StoreFactory, central_url: str) -> None:
    store = await open_store(flush_interval=3600.0)
    for i in range(5):
        await store.set(OWNER, f"k{i}", i)
        await store.set(OWNER, f"k{i}", i * 10)  # version 2, never flushed yet
    await store.set("asset_watcher:stays", "watermark", 7)
    await store.delete(OWNER, "k4")  # a tombstone: flushed, then dropped as well
    await store.sync_local()
    assert {k for k in file_keys(store) if k[0] == OWNER} == {(OWNER, f"k{i}") for i in range(5)}

    report = await store.release(OWNER)
    assert (report.dropped, report.kept, report.flushed, report.unflushed) == (5, 0, 5, 0)
    table = store.entry_table
    assert not table.keys_of(OWNER)
    assert all(k[0] != OWNER for k in table.entries)
    assert ("asset_watcher:stays", "watermark") in table.entries  # another owner: untouched
    await store.sync_local()
    assert {k[0] for k in file_keys(store)} == {"asset_watcher:stays"}
    for i in range(4):
        row = await central_row(central_url, (OWNER, f"k{i}"))
        assert row is not None
        assert (row.data, row.version) == (str(i * 10), 2)
    # read back through, at the latest value and version; a write goes on from there
    for i in range(4):
        record = await store.record(OWNER, f"k{i}")
        assert record is not None
        assert (record.value, record.version) == (i * 10, 2)
    assert await store.get(OWNER, "k4", "gone") == "gone"
    assert await store.set(OWNER, "k0", "again") == 3
    assert store.stats().released_keys == 5
    assert store.stats().conflicts == 0


async def test_a_write_during_the_release_flush_is_kept_and_flushed_later(
        central_url: str, tmp_path: Path) -> None:
    held = HeldFlushes(await CentralStore.open(central_url))
    try:
        async with StateStore(cache_path=tmp_path / "c.db", central_url=central_url,
                              triggerer_id="t", flush_interval=3600.0, sink=held) as store:
            k = (OWNER, "watermark")
            await store.set(*k, 1)
            go_on = held.flush_hold = asyncio.Event()
            release = asyncio.create_task(store.release(OWNER))
            await held.written.wait()  # the central DB holds v1; the store has not heard yet
            assert await store.set(*k, 2) == 2  # the racing write
            go_on.set()
            report = await release
            # the release waited for v1; v2 came in meanwhile: its entry is dirty and stays
            assert (report.dropped, report.kept) == (0, 1)
            entry = store.entry_table.entries[k]
            assert entry.dirty
            assert entry.version == 2
            row = await central_row(central_url, k)
            assert row is not None
            assert (row.data, row.version) == ("1", 1)
            await store.flush()
            row = await central_row(central_url, k)
            assert row is not None
            assert (row.data, row.version) == ("2", 2)
            # released again, now clean: dropped, and it reads back as written
            assert (await store.release(OWNER)).dropped == 1
            assert await store.get(*k) == 2
    finally:
        await held.close()


async def test_a_write_right_after_the_release_is_based_on_the_flushed_version(
        open_store: StoreFactory, central_url: str) -> None:
    # release and a write of the same key started together: whichever way they interleave,
    # the write lands on top of what the release flushed, never beside or under it
    store = await open_store(flush_interval=3600.0)
    k = (OWNER, "watermark")
    for round_ in range(20):
        await store.set(*k, f"a{round_}")
        version = (await store.record(*k)).version  # type: ignore[union-attr]
        release = asyncio.create_task(store.release(OWNER))
        for _ in range(round_ % 4):
            await asyncio.sleep(0)
        assert await store.set(*k, f"b{round_}") == version + 1
        await release
        await store.flush()
        row = await central_row(central_url, k)
        assert row is not None
        assert (row.data, row.version) == (f'"b{round_}"', version + 1)
    assert store.stats().conflicts == 0


async def test_a_read_begun_before_a_release_never_rewinds_the_key(
        open_store: StoreFactory) -> None:
    # a read of k began (it reads v1), then k was written (v2), flushed and released: the
    # row of the read must neither become the entry nor mark k absent
    store = await open_store(central_thread=False)
    table = store.entry_table
    k = (OWNER, "k")
    await store.set(*k, "v1")
    await store.release(OWNER)
    since = table.read_epoch(OWNER)
    central = store.central_store
    assert central is not None
    stale = (await central.read_many([k]))[k]
    assert stale.version == 1
    assert await store.set(*k, "v2") == 2
    assert (await store.release(OWNER)).dropped == 1
    assert table.adopt(k, stale, since) is None
    assert not table.mark_absent((OWNER, "missing"), since)
    assert k not in table.entries
    record = await store.record(*k)
    assert record is not None
    assert (record.value, record.version) == ("v2", 2)


async def test_conflicted_and_awaited_entries_are_not_dropped(
        open_store: StoreFactory) -> None:
    first = await open_store()
    second = await open_store()
    k = (OWNER, "contested")
    await first.set(*k, "first")
    await second.set(*k, "second")  # based on "absent" too: a conflict at its flush
    await first.flush()
    report = await second.release(OWNER, timeout=5.0)
    assert (report.dropped, report.kept, report.unflushed) == (0, 1, 1)  # lost its conflict
    worker = second.sync_worker
    assert worker is not None
    assert k in worker.conflicted
    record = await second.record(*k)
    assert record is not None
    assert (record.value, record.flush_state.value) == ("first", "conflict")
    waiter = worker.expect_flush((OWNER, "awaited"), 1)
    await second.set(OWNER, "awaited", 1)
    await second.flush()
    assert (await second.release(OWNER)).dropped == 0
    worker.drop_waiter((OWNER, "awaited"), waiter)
    assert (await second.release(OWNER)).dropped == 1  # the conflicted one stays


async def test_release_with_the_cache_off_and_bad_input(open_store: StoreFactory) -> None:
    direct = await open_store(enabled=False)
    await direct.set(OWNER, "k", 1)
    assert (await direct.release(OWNER)).dropped == 0
    assert await direct.get(OWNER, "k") == 1
    store = await open_store()
    with pytest.raises(InvalidName):
        await store.release("")
    with pytest.raises(InvalidName):
        await store.release("bad\nowner")
    assert (await store.release("trigger:never-seen")).dropped == 0
    await store.close()
    with pytest.raises(StoreClosed):
        await store.release(OWNER)


async def test_writes_refused_for_a_newer_claim_are_reported_refused_not_unflushed(
        open_store: StoreFactory) -> None:
    zombie = await open_store(triggerer_id="zombie")
    holder = await open_store(triggerer_id="holder")
    assert await zombie.claim(OWNER) == 1
    await zombie.set(OWNER, "wm", 1)
    assert await holder.claim(OWNER) == 2
    report = await zombie.release(OWNER, timeout=5.0)
    assert (report.refused, report.claimed_at_epoch, report.unflushed) == (1, 2, 0)
    assert report.flushed == 0
