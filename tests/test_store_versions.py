"""Versions never go backwards, and a write acknowledged centrally is never silently replaced.

Deterministic regressions for the store-level mechanisms of issue #18 (a load that raced with a
flush, the same live writer's stale base let through the fence) and for writes and deletes of
keys not in memory while the central DB cannot be read (#21). Every race here is made with a
held read or a stepped flush, never with timing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import StoreFactory

from localstate import StateStore, VersionConflict, WriteRejected
from localstate.entry import StateKey
from localstate.sync.central_store import CentralStore
from localstate.sync.conflicts import PolicyMap
from localstate.sync.rows import CentralRow, DirtyRow, FlushOutcome

OWNER = "asset_watcher:versions"


class HeldReads:
    """A sink around a `CentralStore` whose `read_owner` can be held after it has read."""

    def __init__(self, inner: CentralStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.hold: asyncio.Event | None = None
        self.read_done = asyncio.Event()

    @property
    def transactions(self) -> int:
        return self.inner.transactions

    @property
    def rows_written(self) -> int:
        return self.inner.rows_written

    async def read_owner(self, owner: str) -> list[CentralRow]:
        rows = await self.inner.read_owner(owner)
        hold, self.hold = self.hold, None  # holds one read
        if hold is not None:
            self.read_done.set()
            await hold.wait()
        return rows

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        return await self.inner.read_many(keys)

    async def write_batch(self, rows: Sequence[DirtyRow], policies: PolicyMap, **kw: Any
                          ) -> list[FlushOutcome]:
        return await self.inner.write_batch(rows, policies, **kw)

    async def write_direct(self, owner: str, key: str, data: str | None, *, updated_at: float,
                           updated_by: str) -> CentralRow:
        return await self.inner.write_direct(owner, key, data, updated_at=updated_at,
                                             updated_by=updated_by)

    async def close(self) -> None:
        await self.inner.close()


@contextlib.asynccontextmanager
async def central(url: str) -> AsyncIterator[CentralStore]:
    sink = await CentralStore.open(url)
    try:
        yield sink
    finally:
        await sink.close()


async def central_record(url: str, key: str) -> tuple[Any, int] | None:
    async with central(url) as reader:
        row = (await reader.read_many([(OWNER, key)])).get((OWNER, key))
    if row is None:
        return None
    return (None if row.data is None else orjson.loads(row.data)), row.version


# -- a load never lowers an entry (#18, mechanism 1) ---------------------------------------


async def test_a_load_read_before_a_flush_never_puts_the_entry_back(
    central_url: str, tmp_path: Path,
) -> None:
    held = HeldReads(await CentralStore.open(central_url))
    try:
        async with StateStore(cache_path=tmp_path / "c.db", central_url=central_url,
                              triggerer_id="t", flush_interval=60.0, sink=held) as store:
            assert await store.set(OWNER, "k", "v1", durability="central") == 1
            release = held.hold = asyncio.Event()
            load = asyncio.create_task(store.load(OWNER))
            await held.read_done.wait()  # the load has read v1 and is held
            assert await store.compare_and_set(OWNER, "k", "x", expected_version=1,
                                               durability="central") == 2
            release.set()
            assert await load == 1
            record = await store.record(OWNER, "k")
            assert record is not None
            assert (record.value, record.version) == ("x", 2)
            with pytest.raises(VersionConflict):
                await store.compare_and_set(OWNER, "k", "y", expected_version=1,
                                            durability="central")
            assert await central_record(central_url, "k") == ("x", 2)
    finally:
        await held.close()


# -- the fence recognises a replay by the write's identity (#18, mechanism 2) ---------------


async def test_two_compare_and_sets_on_one_version_through_one_store_have_one_winner(
    central_url: str, tmp_path: Path,
) -> None:
    """As the REST PUT does it: load the owner, then compare-and-set. The first caller's load
    is held until the second caller's compare-and-set has been acknowledged."""
    held = HeldReads(await CentralStore.open(central_url))
    try:
        async with StateStore(cache_path=tmp_path / "c.db", central_url=central_url,
                              triggerer_id="t", flush_interval=60.0, sink=held) as store:
            assert await store.set(OWNER, "k", "v1", durability="central") == 1
            release = held.hold = asyncio.Event()
            answers: dict[str, int | BaseException] = {}

            async def put(value: str) -> None:
                try:
                    await store.load(OWNER)
                    answers[value] = await store.compare_and_set(
                        OWNER, "k", value, expected_version=1, durability="central")
                except (VersionConflict, WriteRejected) as exc:
                    answers[value] = exc

            first = asyncio.create_task(put("a"))
            await held.read_done.wait()  # "a" has read v1 and is held
            await put("b")
            release.set()
            await first
        winners = {v: a for v, a in answers.items() if isinstance(a, int)}
        assert winners == {"b": 2}, answers
        assert await central_record(central_url, "k") == ("b", 2)
    finally:
        await held.close()


async def test_a_stale_write_under_a_shared_triggerer_id_is_a_conflict_not_an_overwrite(
    open_store: StoreFactory, central_url: str,
) -> None:
    """Two hosts misconfigured with one triggerer id (each with its own cache file): the id
    names no single writer, so a stale base of either is a conflict like anyone else's."""
    seen: list[Any] = []
    a = await open_store(triggerer_id="t")
    b = await open_store(triggerer_id="t", cache_path=a.settings.resolved_cache_path.with_name(
        "other-host.db"), on_conflict=seen.append)
    assert await a.set(OWNER, "k", "a1", durability="central") == 1
    assert await b.get(OWNER, "k") == "a1"  # b's entry: v1
    assert await a.set(OWNER, "k", "a2", durability="central") == 2  # acknowledged
    with pytest.raises(WriteRejected):
        await b.set(OWNER, "k", "b", durability="central")  # based on v1: stale
    assert await central_record(central_url, "k") == ("a2", 2)
    assert await b.get(OWNER, "k") == "a2"
    assert [(i.winner, i.central_version) for i in seen] == [("central", 2)]

