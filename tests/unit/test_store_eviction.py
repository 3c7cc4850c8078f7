"""A store's bounded working set (`max_keys_in_memory`), and a half-built store's quiet end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import StoreFactory

from localstate import StateStore


def test_half_built_store_is_quiet_when_collected(tmp_path: object) -> None:
    # a constructor that raises leaves a half-built object; collecting it prints nothing
    script = textwrap.dedent("""
        import gc
        from localstate import StateStore
        from localstate.errors import LocalStateError
        try:
            StateStore(cache_path="x.db", no_such_setting=1)
        except LocalStateError as exc:
            print("refused:", type(exc).__name__)
        else:
            raise SystemExit("an unknown setting was accepted")
        gc.collect()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=str(tmp_path), env=os.environ,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:")
    assert "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr
    assert done.stderr == ""


async def _keys_in_memory(store: StateStore) -> int:
    return store.stats().keys_in_memory


async def test_evicted_keys_read_back_at_their_latest_version(open_store: StoreFactory) -> None:
    store = await open_store(max_keys_in_memory=10)
    for i in range(100):
        await store.set("o", f"k{i}", f"a{i}")
        if i % 3 == 0:
            await store.set("o", f"k{i}", f"b{i}")  # version 2
    assert await _keys_in_memory(store) == 100  # all dirty: none evicted
    await store.flush()
    stats = store.stats()
    assert stats.keys_in_memory <= 11
    assert stats.evictions >= 89
    for i in range(100):
        record = await store.record("o", f"k{i}")
        assert record is not None
        assert (record.value, record.version) == (
            (f"b{i}", 2) if i % 3 == 0 else (f"a{i}", 1))
        assert await store.get("o", f"k{i}") == record.value
    assert store.stats().keys_in_memory <= 11  # the reads through were evicted in turn
    # a key evicted and written again goes on from its central version, never back
    assert ("o", "k0") not in store.entry_table.entries
    assert await store.set("o", "k0", "c0") == 3
    assert await store.set("o", "k1", "c1") == 2
    await store.flush()
    other = await open_store()
    for key, value, version in (("k0", "c0", 3), ("k1", "c1", 2)):
        record = await other.record("o", key)
        assert record is not None
        assert (record.value, record.version) == (value, version)
    assert store.stats().conflicts == 0


async def test_dirty_keys_are_never_evicted(open_store: StoreFactory) -> None:
    store = await open_store(max_keys_in_memory=10, flush_interval=3600.0)
    for i in range(100):
        await store.set("o", f"k{i}", i, durability="memory")
    table = store.entry_table
    assert table.evict(0) == 0
    assert len(table.entries) == 100
    assert len(table.dirty) == 100
    await store.flush()
    assert len(table.entries) <= 11
    held = len(table.entries)
    assert table.evict(0) == held  # all clean now, none awaited
    assert not table.entries


async def test_a_row_read_before_an_eviction_never_rewinds_a_key(
        open_store: StoreFactory) -> None:
    # a read through of k began (it reads v1), then a set of k wrote v2, flushed, and k was
    # evicted: the row of the read must not become the entry, nor mark k absent
    # central_thread off: the test reads through the store's own CentralStore
    store = await open_store(max_keys_in_memory=10, central_thread=False)
    table = store.entry_table
    k = ("o", "k")
    await store.set(*k, "v1")
    await store.flush()
    table.evict(0)
    assert k not in table.entries
    since = table.evictions
    central = store.central_store
    assert central is not None
    stale = (await central.read_many([k]))[k]
    assert stale.version == 1
    assert await store.set(*k, "v2") == 2  # read through: based on v1
    await store.flush()
    assert table.evict(0) == 1
    assert table.adopt(k, stale, since) is None
    assert not table.mark_absent(("o", "missing"), since)
    assert k not in table.entries
    assert await store.get(*k) == "v2"
    record = await store.record(*k)
    assert record is not None
    assert record.version == 2


async def test_an_eviction_during_a_first_write_keeps_its_base(
        open_store: StoreFactory) -> None:
    # the steps of a set of an evicted key: its base read, an eviction pass, then the write
    # central_thread off: the test reads through the store's own CentralStore
    store = await open_store(max_keys_in_memory=10, central_thread=False)
    table = store.entry_table
    for i in range(20):
        await store.set("o", f"k{i}", "v1")
        await store.set("o", f"k{i}", "v2")
    await store.flush()
    table.evict(0)
    k = ("o", "k3")
    central = store.central_store
    assert central is not None
    row = (await central.read_many([k]))[k]
    base = table.first_write_base(k, row)
    assert table.evict(0) == 0  # nothing held; the base is not in the map yet
    assert table.write_first(k, base, '"v3"', "v3", True) == 3
    assert table.evict(0) == 0  # dirty now
    await store.flush()
    record = await (await open_store()).record(*k)
    assert record is not None
    assert (record.value, record.version) == ("v3", 3)


async def test_an_eviction_between_collect_and_mark_clean_loses_nothing(
        open_store: StoreFactory) -> None:
    store = await open_store(max_keys_in_memory=10)
    table = store.entry_table
    worker = store.sync_worker
    assert worker is not None
    for i in range(20):
        await store.set("o", f"c{i}", i)
    await store.flush()
    k = ("o", "a")
    await store.set(*k, "1")
    await store.set(*k, "2")
    rows = worker.collect_dirty()
    assert [(r.key, r.version) for r in rows] == [("a", 2)]
    table.evict(0)
    assert k in table.entries  # dirty: stays
    assert await store.set(*k, "3") == 3  # written during the flush
    outcomes = await worker.write_batch(rows)
    table.evict(0)
    worker.mark_clean(outcomes)
    assert table.entries[k].dirty  # v3 still owed
    assert table.evict(0) == 0
    await store.flush()
    assert table.evict(0) == 1
    assert k not in table.entries
    record = await store.record(*k)
    assert record is not None
    assert (record.value, record.version) == ("3", 3)
    assert store.stats().conflicts == 0


async def test_conflicted_and_awaited_keys_stay_in_memory(open_store: StoreFactory) -> None:
    first = await open_store(max_keys_in_memory=10)
    second = await open_store(max_keys_in_memory=10)
    k = ("o", "contested")
    await first.set(*k, "first")
    await second.set(*k, "second")  # based on "absent" too: a conflict at its flush
    await first.flush()
    await second.flush()
    table, worker = second.entry_table, second.sync_worker
    assert worker is not None
    assert k in worker.conflicted
    assert table.evict(0) == 0  # its flush state ("conflict") is still to be read
    record = await second.record(*k)
    assert record is not None
    assert record.value == "first"
    waiter = worker.expect_flush(("o", "awaited"), 1)
    await second.set("o", "awaited", 1)
    await second.flush()
    assert ("o", "awaited") in table.entries
    assert table.evict(0) == 0
    worker.drop_waiter(("o", "awaited"), waiter)
    assert table.evict(0) == 1
