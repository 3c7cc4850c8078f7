"""Versions never go backwards, and a write acknowledged centrally is never silently replaced.

Deterministic regressions for the store-level mechanisms of issue #18 (a load that raced with a
flush, the same live writer's stale base let through the fence) and for writes and deletes of
keys not in memory while the central DB cannot be read (#21). Every race here is made with a
held read or a stepped flush, never with timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import StoreFactory

from localstate import CentralUnavailable, StateStore, VersionConflict, WriteRejected
from localstate._cache.entry import StateKey
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate._sync.central.central_store import CentralStore
from localstate._testing.postgres_server import PostgresServer

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
                           updated_by: str, writer: str | None = None) -> CentralRow:
        return await self.inner.write_direct(owner, key, data, updated_at=updated_at,
                                             updated_by=updated_by, writer=writer)

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             writer: str | None = None) -> bool:
        return await self.inner.delete_current(owner, key, updated_by=updated_by, writer=writer)

    async def write_if_version(self, owner: str, key: str, data: str | None,
                               expected_version: int, *, updated_by: str,
                               updated_at: float | None = None,
                               writer: str | None = None) -> CentralRow:
        return await self.inner.write_if_version(owner, key, data, expected_version,
                                                 updated_by=updated_by, updated_at=updated_at,
                                                 writer=writer)

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


# -- keys not in memory while the central DB cannot be read (#21, items 1 and 2) -------------


class Outage:
    """Makes the central DB of a test unreadable and readable again, on either backend:
    PostgreSQL is stopped; the SQLite file is moved aside and a file that is not a database
    put in its place (the tests run as root, which file modes do not stop)."""

    def __init__(self, backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.backend = backend
        if backend == "postgresql":
            self.pg: PostgresServer = request.getfixturevalue("private_pg")
            self.url = self.pg.create_database(f"outage_{uuid.uuid4().hex[:12]}")
        else:
            self.path = tmp_path / "central.db"
            self.url = f"sqlite:///{self.path}"
        self.store: StateStore | None = None

    @contextlib.asynccontextmanager
    async def down(self) -> AsyncIterator[None]:
        if self.backend == "postgresql":
            await asyncio.to_thread(self.pg.stop, "fast")
            try:
                yield
            finally:
                await asyncio.to_thread(self.pg.start)
            return
        assert self.store is not None
        assert self.store.central_store is not None
        engine = self.store.central_store.engine
        await engine.dispose()  # the pooled connections would go on reading the moved file
        moved = _swap_out(self.path)
        try:
            yield
        finally:
            await engine.dispose()
            _swap_back(self.path, moved)

    async def open_store(self, tmp_path: Path, **options: Any) -> StateStore:
        # with the sink on this loop, the SQLite outage can drop its pooled connections
        self.store = await StateStore.open(
            central_url=self.url, cache_path=tmp_path / "cache.db", triggerer_id="t",
            flush_interval=60.0, central_thread=False, **options)
        return self.store


def _swap_out(path: Path) -> list[tuple[Path, Path]]:
    """Move the SQLite database `path` (and its WAL files) aside; put garbage in its place."""
    moved = [(Path(f"{path}{s}"), Path(f"{path}{s}.away"))
             for s in ("", "-wal", "-shm") if Path(f"{path}{s}").exists()]
    for here, away in moved:
        here.rename(away)
    path.write_bytes(b"this is not a database " * 100)
    return moved


def _swap_back(path: Path, moved: list[tuple[Path, Path]]) -> None:
    for s in ("", "-wal", "-shm"):
        Path(f"{path}{s}").unlink(missing_ok=True)
    for here, away in moved:
        away.rename(here)


@pytest.fixture(params=["sqlite", "postgresql"])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Outage:
    return Outage(str(request.param), tmp_path, request)


async def forget_memory(store: StateStore) -> None:
    """Empty the store's memory the way the issue did: turn the cache off and on again."""
    await store.reconfigure(store.settings.replace(enabled=False))
    await store.reconfigure(store.settings.replace(enabled=True))
    assert store.stats().keys_in_memory == 0


async def test_a_write_to_a_key_not_in_memory_while_central_is_down_never_goes_back(
    outage: Outage, tmp_path: Path,
) -> None:
    store = await outage.open_store(tmp_path)
    try:
        for i in range(1, 6):
            assert await store.set(OWNER, "k", i) == i
        await store.flush()
        await forget_memory(store)
        async with outage.down():
            v6 = await store.set(OWNER, "k", 6)
            assert v6 > 5  # above any version the central DB holds, though it was not read
            v7 = await store.set(OWNER, "k", 7, durability="memory")
            assert v7 == v6 + 1
        report = await store.flush()
        assert (report.written, report.conflicts) == (1, 0)
        assert await store.get(OWNER, "k") == 7
        record = await store.record(OWNER, "k")
        assert record is not None
        assert record.version == v7
    finally:
        await store.close()
    assert await central_record(outage.url, "k") == (7, v7)


async def test_a_delete_of_a_key_not_in_memory_while_central_is_down_happens_later(
    outage: Outage, tmp_path: Path,
) -> None:
    store = await outage.open_store(tmp_path, absent_ttl=0.2)
    try:
        await store.set(OWNER, "gone", "x")
        await store.flush()
        await forget_memory(store)
        async with outage.down():
            # it cannot tell whether the key has a value: never "there was nothing"
            assert await store.delete(OWNER, "gone") is True
            assert await store.get(OWNER, "gone") is None
        report = await store.flush()
        assert (report.written, report.conflicts) == (1, 0)
        assert await central_record(outage.url, "gone") is not None
        assert (await central_record(outage.url, "gone") or (0, 0))[0] is None  # a tombstone
        assert await store.get(OWNER, "gone") is None
        assert await store.delete(OWNER, "gone") is False  # known now: nothing to delete
    finally:
        await store.close()


async def test_a_compare_and_set_of_a_key_not_in_memory_while_central_is_down_is_refused(
    outage: Outage, tmp_path: Path,
) -> None:
    store = await outage.open_store(tmp_path)
    try:
        await store.set(OWNER, "k", "v1")
        await store.flush()
        await forget_memory(store)
        async with outage.down():
            with pytest.raises(CentralUnavailable):
                await store.compare_and_set(OWNER, "k", "v2", expected_version=1)
            assert store.stats().dirty_keys == 0  # nothing was written
        assert await store.compare_and_set(OWNER, "k", "v2", expected_version=1) == 2
        await store.flush()
    finally:
        await store.close()
    assert await central_record(outage.url, "k") == ("v2", 2)


# -- a committed read through the store ----------------------------------------------------


async def test_read_committed_shows_the_central_record_and_never_lowers_an_entry(
    open_store: StoreFactory,
) -> None:
    a = await open_store()
    b = await open_store()
    await a.set(OWNER, "k", "a1", durability="central")
    assert await b.get(OWNER, "k") == "a1"  # read through, now held by b
    await a.set(OWNER, "k", "a2", durability="central")
    assert await b.get(OWNER, "k") == "a1"  # b's memory: a2 was written elsewhere
    committed = await b.read_committed(OWNER, "k")
    assert committed is not None
    assert (committed.value, committed.version) == ("a2", 2)
    assert await b.get(OWNER, "k") == "a2"  # the newer row refreshed b's clean entry
    # a write b still owes the central DB is not committed: not shown, and not lowered
    assert await b.set(OWNER, "k", "b3", durability="memory") == 3
    committed = await b.read_committed(OWNER, "k")
    assert committed is not None
    assert (committed.value, committed.version) == ("a2", 2)
    assert await b.get(OWNER, "k") == "b3"
    assert await b.read_committed(OWNER, "missing") is None


# -- central-durability compare-and-set and delete decide on the committed record -------


async def test_a_central_compare_and_set_decides_on_the_committed_record_not_a_pending_write(
    open_store: StoreFactory, central_url: str,
) -> None:
    """A holds a pending write of its own that B's commit will beat. A compare-and-set on the
    version B committed succeeds (it used to be compared with A's pending version, pass, and
    then lose at the flush with WriteRejected)."""
    a = await open_store(triggerer_id="a", flush_interval=3600.0)
    b = await open_store(triggerer_id="b", flush_interval=3600.0)
    assert await a.set(OWNER, "k", "v1", durability="central") == 1
    assert await a.set(OWNER, "k", "pending", durability="memory") == 2  # not flushed
    assert await b.compare_and_set(OWNER, "k", "by b", expected_version=1,
                                   durability="central") == 2
    version = await a.compare_and_set(OWNER, "k", "z", expected_version=2,
                                      durability="central")
    assert version == 3
    assert await central_record(central_url, "k") == ("z", 3)
    with pytest.raises(VersionConflict) as caught:  # and the committed version is what counts
        await a.compare_and_set(OWNER, "k", "again", expected_version=2, durability="central")
    assert caught.value.actual == 3


async def test_a_central_delete_is_not_answered_from_a_pending_tombstone(
    open_store: StoreFactory, central_url: str,
) -> None:
    a = await open_store(triggerer_id="a", flush_interval=3600.0)
    b = await open_store(triggerer_id="b", flush_interval=3600.0)
    assert await a.set(OWNER, "k", "v1", durability="central") == 1
    assert await a.delete(OWNER, "k", durability="memory")  # a pending tombstone, v2
    assert await b.compare_and_set(OWNER, "k", "by b", expected_version=1,
                                   durability="central") == 2
    # the committed record has a value: the delete deletes it (it used to answer False)
    assert await a.delete(OWNER, "k", durability="central")
    record = await central_record(central_url, "k")
    assert record is not None
    assert record[0] is None  # a tombstone


async def test_two_deletes_with_the_cache_off_have_one_winner(
    open_store: StoreFactory,
) -> None:
    a = await open_store(triggerer_id="a", enabled=False)
    b = await open_store(triggerer_id="b", enabled=False)
    for round_ in range(10):
        await a.set(OWNER, "k", round_)
        answers = await asyncio.gather(a.delete(OWNER, "k"), b.delete(OWNER, "k"))
        assert sorted(answers) == [False, True], (round_, answers)
        assert await a.get(OWNER, "k") is None


async def test_a_central_insert_if_absent_over_another_stores_tombstone_succeeds(
    open_store: StoreFactory, central_url: str,
) -> None:
    """The key has no value (another store wrote and deleted it since this store's own
    delete): a compare-and-set on version 0 succeeds. Its first flush meets the unseen
    tombstone and is refused; the compare is made again on the committed record."""
    a = await open_store(triggerer_id="a", flush_interval=3600.0)
    b = await open_store(triggerer_id="b", flush_interval=3600.0)
    assert await a.set(OWNER, "k", "v1", durability="central") == 1
    assert await a.delete(OWNER, "k", durability="central")  # a tombstone at v2, flushed
    assert await b.compare_and_set(OWNER, "k", "by b", expected_version=0,
                                   durability="central") == 3
    assert await b.delete(OWNER, "k", durability="central")  # b's tombstone at v4
    version = await a.compare_and_set(OWNER, "k", "mine", expected_version=0,
                                      durability="central")
    assert version == 5
    assert await central_record(central_url, "k") == ("mine", 5)


# -- one store, one writer, versions forward across modes (#32) -------------------------------


async def test_a_first_write_long_after_a_miss_counts_from_one_with_the_central_db_up(
    open_store: StoreFactory, central_url: str,
) -> None:
    """A watcher's first `get` finds nothing; its first `set` comes after `absent_ttl`. With
    `max` and `local` durability that set does not read its base (it never waits for a read):
    it used to get a clock version (1.8e15). The store last saw the key absent and has shown
    no version of it since, so it counts from 0."""
    store = await open_store(conflict_policy="max", absent_ttl=0.01)
    assert await store.get(OWNER, "fresh") is None
    await asyncio.sleep(0.05)  # past absent_ttl: the key is no longer known to be absent
    assert not store.entry_table.is_absent((OWNER, "fresh"))
    assert await store.set(OWNER, "fresh", 10) == 1
    assert await store.set(OWNER, "fresh", 11) == 2
    report = await store.flush()
    assert (report.written, report.conflicts) == (1, 0)
    assert await central_record(central_url, "fresh") == (11, 2)
    # a key this store never read still gets a clock version: above any the DB can hold
    assert await store.set(OWNER, "never-read", 1) > 10**15


def test_clock_versions_only_grow_within_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import localstate._cache.entry as entry

    first = entry.unknown_base_version()
    monkeypatch.setattr(entry, "_now", lambda: 1.0)  # the clock stepped back
    assert entry.unknown_base_version() == first + 1
    assert entry.unknown_base_version() == first + 2


@pytest.mark.parametrize("policy", ["reject", "max", "last_writer_wins"])
async def test_the_stores_own_direct_writes_are_never_its_conflicts(
    outage: Outage, tmp_path: Path, policy: str,
) -> None:
    """Direct-mode writes carry the store's writer id (its cache file's): a write made later
    with the cache on, on a base it could not read (central down), replaces them as the
    store's own chain, under every policy, and its version stays above theirs."""
    seen: list[Any] = []
    store = await outage.open_store(tmp_path, conflict_policy=policy, on_conflict=seen.append)
    try:
        assert await store.set(OWNER, "k", 100, durability="central") == 1
        await store.reconfigure(store.settings.replace(enabled=False))
        assert store.stats().cache_enabled is False
        assert await store.set(OWNER, "k", 200) == 2  # direct
        assert await store.compare_and_set(OWNER, "k", 300, expected_version=2) == 3
        await store.reconfigure(store.settings.replace(enabled=True))
        assert store.stats().keys_in_memory == 0
        async with outage.down():
            v = await store.set(OWNER, "k", 5)  # lower than 300: max must still take it
            assert v > 3
        report = await store.flush()
        assert (report.written, report.conflicts) == (1, 0)
        assert seen == []
        assert await store.get(OWNER, "k") == 5
        # off again: the direct path counts on from the (clock) version the flush carried
        await store.reconfigure(store.settings.replace(enabled=False))
        assert await store.set(OWNER, "k", 6) == v + 1
        assert await store.compare_and_set(OWNER, "k", 7, expected_version=v + 1) == v + 2
        assert await store.delete(OWNER, "k") is True
    finally:
        await store.close()
    assert seen == []


async def test_a_store_started_with_the_cache_off_is_one_writer_with_the_file_it_creates(
    outage: Outage, tmp_path: Path,
) -> None:
    """Started with the cache off and no cache file, a store creates none (a task on a worker
    host keeps none) and writes under an id of its own; the file created when the cache is
    turned on takes that id, so those direct writes are the store's own chain too."""
    seen: list[Any] = []
    store = await outage.open_store(tmp_path, enabled=False, on_conflict=seen.append)
    try:
        assert not (tmp_path / "cache.db").exists()
        assert await store.set(OWNER, "k", 1) == 1  # direct
        await store.reconfigure(store.settings.replace(enabled=True))
        assert (tmp_path / "cache.db").exists()
        async with outage.down():
            v = await store.set(OWNER, "k", 2)  # base unknown: central cannot be read
        report = await store.flush()
        assert (report.written, report.conflicts) == (1, 0)
        assert seen == []
    finally:
        await store.close()
    assert await central_record(outage.url, "k") == (2, v)
