"""The local cache on a full disk, through the public `StateStore`.

A full disk is a real one: a tmpfs of 4 MiB mounted by the test (the suite runs as root in CI
and here), filled to the last byte by a filler file, so SQLite meets the kernel's ``ENOSPC``.
Run without root, SQLite's ``PRAGMA max_page_count`` on the cache's connection stands in for it
(see `disks.py`). Then: `set` raises `CacheFull` naming the file and the way out, nothing
acknowledged is lost (checked in the reopened cache file and in the central DB), the store keeps
serving reads and flushes, writes resume when the filler is removed, and a restart on the
still-full disk is refused with the same clear error and changes nothing.

Files a cache cannot use are in `test_file_faults.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from disks import CAN_MOUNT, PageLimitDisk, TmpfsDisk, files_under, integrity
from fault_tally import FaultTally

from localstate import CacheFull, StateStore
from localstate._sync.central.central_store import CentralStore

OWNER = "asset_watcher:disk"

FullDisk = TmpfsDisk | PageLimitDisk


@pytest.fixture(params=["tmpfs"] if CAN_MOUNT else ["max_page_count"])
def full_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FullDisk]:
    if request.param == "max_page_count":
        yield PageLimitDisk(tmp_path / "disk")
        return
    disk = TmpfsDisk(tmp_path / "disk")
    disk.mount()
    try:
        yield disk
    finally:
        disk.unmount()


def watermark(i: int) -> dict[str, Any]:
    return {"offset": i, "pad": "w" * 2000}  # 2 KB: a few writes need a new page


async def open_store(path: Path, central_url: str) -> StateStore:
    return await StateStore.open(cache_path=path, central_url=central_url,
                                 triggerer_id="full-disk", flush_interval=60)


async def set_until_refused(store: StateStore, acked: dict[str, tuple[Any, int]], prefix: str
                            ) -> CacheFull:
    """Keep writing new keys; record each acknowledged one; return the error that stops it.

    The first writes may still fit (SQLite reuses the WAL's pages after a checkpoint); a new key
    every time needs new pages soon.
    """
    for i in range(2000):
        key = f"{prefix}-{i}"
        try:
            version = await store.set(OWNER, key, watermark(i))
        except CacheFull as exc:
            return exc
        acked[key] = (watermark(i), version)
    raise AssertionError("2,000 writes of 2 KB fitted on a full disk: it never filled")


def assert_says_full(exc: CacheFull, path: Path, *, committing: bool = True) -> None:
    message = str(exc)
    assert exc.path == str(path)
    assert str(path) in message  # which file
    assert "disk holding it is full" in message  # what is wrong
    assert "free space" in message  # the way out
    assert "cache_dir" in message
    if committing:
        assert "not acknowledged" in message  # what became of this write


async def check_central(central_url: str, acked: dict[str, tuple[Any, int]]) -> int:
    """How many acknowledged writes the central DB lacks (or holds an older version of)."""
    central = await CentralStore.open(central_url)
    try:
        rows = await central.read_many([(OWNER, k) for k in acked])
    finally:
        await central.close()
    return sum(
        1 for k, (value, version) in acked.items()
        if (row := rows.get((OWNER, k))) is None or row.data is None or row.version < version
        or (row.version == version and orjson.loads(row.data) != value)
    )


async def test_full_disk_refuses_writes_clearly_loses_nothing_and_recovers(
    full_disk: FullDisk, central_url: str, fault_tally: FaultTally
) -> None:
    path = full_disk.folder / "cache.db"
    full_disk.folder.mkdir(parents=True, exist_ok=True)
    acked: dict[str, tuple[Any, int]] = {}  # key -> (value, version) of acknowledged writes
    store = await open_store(path, central_url)
    try:
        for i in range(40):  # acknowledged before the disk fills; the first half flushed
            acked[f"before-{i}"] = (watermark(i), await store.set(OWNER, f"before-{i}",
                                                                   watermark(i)))
            if i == 19:
                await store.flush()
        assert await full_disk.fill(store) > 0

        refused = await set_until_refused(store, acked, "while-full")
        assert_says_full(refused, path)
        # the store stays usable: every acknowledged value reads back, memory writes are taken,
        # and flushes still reach the central DB (the local disk is not in their way)
        for key, (value, _version) in acked.items():
            assert await store.get(OWNER, key) == value
        await store.set(OWNER, "memory-while-full", 1, durability="memory")
        report = await store.flush()
        assert report.conflicts == 0
        assert await check_central(central_url, acked) == 0
        # a `local` write keeps failing, clearly, while the disk stays full
        with pytest.raises(CacheFull):
            await store.set(OWNER, "still-full", 1)

        await full_disk.free(store)
        # space is back: writes are acknowledged again (the retries commit what was kept)
        version = await asyncio.wait_for(store.set(OWNER, "after-free", watermark(-1)), 30)
        acked["after-free"] = (watermark(-1), version)
    finally:
        await store.close()

    if full_disk.restart_while_full:
        # a triggerer restarting on the still-full disk: SQLite cannot create the -shm file
        # it needs to open the cache, and the open says so; nothing in the folder changes
        await full_disk.fill()
        before = files_under(full_disk.folder)
        with pytest.raises(CacheFull) as info:
            await open_store(path, central_url)
        assert_says_full(info.value, path, committing=False)
        after = files_under(full_disk.folder)
        assert [p for p in before if after.get(p) != before[p]] == []
        await full_disk.free()

    assert integrity(path) == "ok"
    store = await open_store(path, central_url)
    try:
        lost_locally = 0
        for key, (value, version) in acked.items():
            record = await store.record(OWNER, key)
            if record is None or record.version < version or (
                    record.version == version and record.value != value):
                lost_locally += 1
        # a write refused for the full disk was kept in memory and committed later
        assert await store.get(OWNER, "still-full") == 1
    finally:
        await store.close()
    lost = lost_locally + await check_central(central_url, acked)
    fault_tally.add("file faults checked")
    fault_tally.add("acknowledged writes checked", 2 * len(acked))
    fault_tally.lost("local (disk full)", lost)
    assert lost == 0, f"{lost_locally} acknowledged writes lost locally, {lost - lost_locally} " \
                      "centrally"
    assert len(acked) > 40  # the check covered writes made after the disk filled, too
