"""`ReadThrough` and the store's reads of keys not in memory: a read never answers with a
snapshot older than its call, so an entry dropped from memory (an eviction, a release) is never
read back below a version the store acknowledged.

The interleavings are forced, not hoped for: `HeldAnswers` is the real central DB (on each
backend) whose answer to one read is held back after its query ran, so the read's snapshot is
taken at a known moment and delivered at another.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio
from conftest import StoreFactory

from localstate import StateStore
from localstate._cache.entry import StateKey
from localstate._core.rows import CentralRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.sinks.read_through import ReadThrough
from localstate.errors import VersionConflict

OWNER = "dag:held"
KEY = "k"


class HeldAnswers(CentralStore):
    """The central DB; once `hold_next` is called, the next read runs its query and then waits
    for the returned event before it answers."""

    _hold: asyncio.Event | None = None
    #: set when the held read's query has run (its snapshot is taken)
    ran: asyncio.Event

    def hold_next(self) -> asyncio.Event:
        self.ran = asyncio.Event()
        self._hold = release = asyncio.Event()
        return release

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        rows = await super().read_many(keys)
        hold, self._hold = self._hold, None
        if hold is not None:
            self.ran.set()
            await hold.wait()
        return rows


@pytest_asyncio.fixture
async def held(central_url: str) -> AsyncIterator[HeldAnswers]:
    central = await HeldAnswers.open(central_url)
    assert isinstance(central, HeldAnswers)
    yield central
    await central.close()


async def _registered(task: asyncio.Future[Any]) -> None:
    """Let `task` run up to its first wait: a fetch registers its read without awaiting."""
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done(), "the task should be waiting for the held read"


async def test_a_fetch_made_during_a_read_of_its_key_gets_a_newer_snapshot(
        held: HeldAnswers, open_store: StoreFactory) -> None:
    writer = await open_store(triggerer_id="writer")
    await writer.set(OWNER, KEY, "old", durability="central")
    reader = ReadThrough(held)
    release = held.hold_next()
    first = asyncio.ensure_future(reader.fetch((OWNER, KEY)))
    await held.ran.wait()  # its snapshot holds "old"
    await writer.set(OWNER, KEY, "new", durability="central")
    second = asyncio.ensure_future(reader.fetch((OWNER, KEY)))  # called after the commit
    await _registered(second)
    release.set()
    old, new = await first, await second
    assert old is not None
    assert old.data == '"old"'
    assert new is not None
    assert (new.data, new.version) == ('"new"', 2)
    assert reader.queries == 2
    await reader.close()


@pytest.mark.parametrize("drop", ["evict", "release"])
@pytest.mark.parametrize(("before", "via"), [("value", "compare_and_set"),
                                             ("deleted", "compare_and_set"),
                                             ("value", "get_many")])
async def test_an_acknowledged_write_is_never_lost_to_a_read_that_began_before_it(
        held: HeldAnswers, open_store: StoreFactory, drop: str, before: str, via: str) -> None:
    """The lost update the linearizability checker found under constant evictions: a read of a
    key begins, the store writes the key and the central DB acknowledges it, the entry is
    dropped, and a compare-and-set (or a `get_many` before it) joins the read begun before the
    write. Based on that old snapshot, the compare-and-set's flush replaced the acknowledged
    write (the fence lets a file replace a row of its own chain above its base) and answered
    success at the same version."""
    other = await open_store(triggerer_id="other")
    await other.set(OWNER, KEY, "first", durability="central")  # v1 by another writer
    if before == "deleted":
        await other.delete(OWNER, KEY, durability="central")  # a tombstone at v2
    base = 1 if before == "value" else 2
    expected = 1 if before == "value" else 0  # "at v1" / "if absent"
    store: StateStore = await open_store(triggerer_id="store", sink=held)

    release = held.hold_next()
    reading = asyncio.ensure_future(store.get(OWNER, KEY))  # a read through, held
    await held.ran.wait()  # its snapshot: the record at `base`
    await store.read_committed(OWNER, KEY)  # the entry, at `base`, joins the table
    acked = await store.set(OWNER, KEY, "acknowledged", durability="central")
    assert acked == base + 1
    if drop == "evict":
        assert store.entry_table.evict(0) == 1
    else:
        assert (await store.release(OWNER)).dropped == 1

    def compare() -> asyncio.Future[Any]:
        return asyncio.ensure_future(store.compare_and_set(
            OWNER, KEY, "compared", expected_version=expected, durability="central"))

    joining: asyncio.Future[Any] = (
        compare() if via == "compare_and_set" else
        asyncio.ensure_future(store.get_many(OWNER, [KEY])))
    await _registered(joining)
    release.set()
    if via == "get_many":
        assert await joining == {KEY: "acknowledged"}
        joining = compare()
    with pytest.raises(VersionConflict) as refused:
        await joining
    assert refused.value.actual == acked
    assert await reading in ("acknowledged", "first", None)  # began before the write
    row = (await other.read_committed(OWNER, KEY))
    assert row is not None
    assert (row.value, row.version) == ("acknowledged", acked)
    record = await store.record(OWNER, KEY)
    assert record is not None
    assert (record.value, record.version) == ("acknowledged", acked)
