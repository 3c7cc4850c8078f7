"""The sync worker through `StateStore`, and step by step: coalescing, batching, fencing races
under each conflict policy, a randomized failover schedule, read-through, restarts, outages of
a real PostgreSQL server, central durability and direct mode.

Central statements and transactions are counted with SQLAlchemy's cursor and commit events on
the store's own engine, never by trusting the code's counters. Tests that stop the PostgreSQL
server make their own database on it (so they run on PostgreSQL only, by construction) and
always start it again in a ``finally``: the server is shared by the whole session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import StoreFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from statement_log import StatementLog, rows_carried

from localstate import (
    CentralUnavailable,
    FlushState,
    InvalidInput,
    StateStore,
    VersionConflict,
    WriteRejected,
)
from localstate._cache.entry import UNKNOWN_BASE
from localstate._cache.local_cache import LocalCache
from localstate._core.rows import CentralRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.flush.settle import ConflictInfo
from localstate._sync.flush.worker import SyncWorker, wait_awake
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer

OWNER = "asset_watcher:orders"


# -- helpers -------------------------------------------------------------------------------


def json_of(data: str | bytes | None) -> Any:
    """A value as JSON text or bytes, decoded (None stays None)."""
    return None if data is None else orjson.loads(data)


def sink_of(store: StateStore) -> CentralStore:
    sink = store.central_store
    assert sink is not None
    return sink


def worker_of(store: StateStore) -> SyncWorker:
    worker = store.sync_worker
    assert worker is not None
    return worker


@contextlib.asynccontextmanager
async def central_reader(url: str) -> AsyncIterator[CentralStore]:
    """A CentralStore of its own: what the central DB holds, not what a store believes."""
    reader = await CentralStore.open(url)
    try:
        yield reader
    finally:
        await reader.close()


async def central_row(reader: CentralStore, key: str, owner: str = OWNER) -> CentralRow | None:
    return (await reader.read_many([(owner, key)])).get((owner, key))


async def central_value(reader: CentralStore, key: str, owner: str = OWNER) -> Any:
    row = await central_row(reader, key, owner)
    return None if row is None or row.data is None else orjson.loads(row.data)


async def eventually(check: Callable[[], Awaitable[bool]], what: str,
                     timeout: float = 60.0) -> None:
    """Wait until `check()` holds (a generous deadline, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


async def flush_once_back(store: StateStore) -> None:
    """Flush, retrying while the central DB is still coming back."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await store.flush()
        except CentralUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
        else:
            return


def new_database(server: PostgresServer | MysqlServer, purpose: str, *,
                 crash_safe: bool = False) -> str:
    """A fresh database on the shared server.

    The PostgreSQL server runs with ``synchronous_commit=off`` for speed, so a crash of it (an
    ``immediate`` stop) may lose commits it already acknowledged; `crash_safe` turns commits
    of this database synchronous again, so that "acknowledged" means "survives the crash" (the
    MySQL server's commits reach the OS before they return: nothing to turn on).
    """
    name = f"{purpose}_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    pg = server if isinstance(server, PostgresServer) else None
    if crash_safe and pg is not None:
        pg.psql(f"ALTER DATABASE {name} SET synchronous_commit = on", dbname="postgres")
    return url


def local_rows(cache_path: Path) -> dict[str, tuple[Any, int, int]]:
    """key -> (value, version, synced_version), read straight from the cache file."""
    with contextlib.closing(sqlite3.connect(f"file:{cache_path}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT key, value, version, synced_version FROM state").fetchall()
    return {k: (orjson.loads(v), ver, synced) for k, v, ver, synced in rows}


# -- coalescing and batching ---------------------------------------------------------------


async def test_a_key_set_1000_times_between_flushes_is_one_row_write(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store()
    for i in range(1000):
        await store.set(OWNER, "watermark", i, durability="memory")
    with StatementLog(store).watching() as log:
        report = await store.flush()
    inserts = log.of_kind("INSERT")
    assert len(inserts) == 1
    assert rows_carried(inserts[0][1]) == 1
    assert log.commits == 1
    assert (report.rows, report.written, report.transactions) == (1, 1, 1)
    async with central_reader(central_url) as reader:
        row = await central_row(reader, "watermark")
    assert row is not None
    assert (orjson.loads(row.data or b""), row.version) == (999, 1000)  # the latest version
    # nothing dirty: a flush sends nothing at all
    with StatementLog(store).watching() as log:
        assert (await store.flush()).rows == 0
    assert (log.statements, log.commits) == ([], 0)


async def test_1000_dirty_keys_with_max_batch_100_are_10_transactions_of_100_rows(
    open_store: StoreFactory, central_url: str,
) -> None:
    keys = [f"k{i:04}" for i in range(1000)]
    first = await open_store()
    for i, k in enumerate(keys):
        await first.set(OWNER, k, i, durability="memory")
    await first.flush()
    # a triggerer taking the owner over preloads it in one query, then updates every key
    # (its history off: the trim of the owner's history, a transaction of its own once 100
    # rows were added, is counted in tests/unit/test_history.py)
    store = await open_store(max_batch=100, history=False)
    assert await store.load(OWNER) == 1000
    for i, k in enumerate(keys):
        await store.set(OWNER, k, i + 1000, durability="memory")
    with StatementLog(store).watching() as log:
        report = await store.flush()
    inserts = log.of_kind("INSERT")
    assert [rows_carried(p) for _, p in inserts] == [100] * 10
    assert log.commits == 10
    assert (report.written, report.conflicts, report.transactions) == (1000, 0, 10)
    async with central_reader(central_url) as reader:
        rows = await reader.read_owner(OWNER)
    assert sorted((r.key, orjson.loads(r.data or b""), r.version) for r in rows) == [
        (k, i + 1000, 2) for i, k in enumerate(keys)]


async def test_max_batch_dirty_keys_start_a_flush_without_waiting_for_the_interval(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(max_batch=50, flush_interval=3600)
    for i in range(50):
        await store.set(OWNER, f"k{i}", i, durability="memory")

    async with central_reader(central_url) as reader:
        async def all_flushed() -> bool:
            return len(await reader.read_owner(OWNER)) == 50

        await eventually(all_flushed, "the worker to flush a full batch on its own")
    assert store.stats().dirty_keys == 0


async def test_refresh_clean_takes_the_newer_central_rows_of_clean_keys_only(
    open_store: StoreFactory, central_url: str,
) -> None:
    """The step a file opened without its clean-close mark runs before its first flush: a
    clean key takes a newer central row; a dirty key is the flush's, and a key the central DB
    holds at the file's version stays as it is."""
    store = await open_store()
    worker = worker_of(store)
    for key in ("behind", "dirty", "same"):
        await store.set(OWNER, key, 1)
    await store.flush()
    await store.set(OWNER, "dirty", 2)  # not flushed
    async with central_reader(central_url) as central:  # the central DB moves on meanwhile
        for key, value in (("behind", "5"), ("dirty", "7")):
            await central.write_direct(OWNER, key, value, updated_at=time.time(),
                                       updated_by="elsewhere")
    assert await worker.refresh_clean() == 1
    assert [await store.get(OWNER, k) for k in ("behind", "dirty", "same")] == [5, 2, 1]
    record = await store.record(OWNER, "behind")
    assert record is not None
    assert (record.flush_state, record.central_version) == (FlushState.FLUSHED, 2)


async def test_a_key_written_during_its_flush_stays_dirty_and_goes_out_next(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store()
    worker = worker_of(store)
    await store.set(OWNER, "k", "v1")
    await store.set(OWNER, "other", "x")
    rows = worker.collect_dirty()
    assert sorted((r.key, r.version, r.base_version) for r in rows) == [
        ("k", 1, 0), ("other", 1, 0)]
    await store.set(OWNER, "k", "v2")  # lands while the flush is in flight
    outcomes = await worker.write_batch(rows)
    worker.mark_clean(outcomes)

    record = await store.record(OWNER, "k")
    assert record is not None
    assert (record.value, record.flush_state, record.central_version) == (
        "v2", FlushState.DIRTY, 1)
    other = await store.record(OWNER, "other")
    assert other is not None
    assert other.flush_state == FlushState.FLUSHED
    assert store.stats().dirty_keys == 1
    async with central_reader(central_url) as reader:
        row = await central_row(reader, "k")
        assert row is not None
        assert (orjson.loads(row.data or b""), row.version) == ("v1", 1)

        report = await store.flush()
        assert [o.row.key for o in report.outcomes] == ["k"]
        assert (report.written, report.conflicts) == (1, 0)
        row = await central_row(reader, "k")
        assert row is not None
        assert (orjson.loads(row.data or b""), row.version) == ("v2", 2)
    record = await store.record(OWNER, "k")
    assert record is not None
    assert (record.flush_state, record.version, record.central_version) == (
        FlushState.FLUSHED, 2, 2)


@pytest.mark.parametrize("policy", ["reject", "last_writer_wins", "max"])
async def test_a_flush_committed_but_never_marked_clean_is_replayed_without_conflict(
    open_store: StoreFactory, central_url: str, policy: str,
) -> None:
    """The commit landed but the reply was lost (connection dropped, crash before mark_clean):
    the next flush sends the same rows again; it must neither conflict nor bump the version."""
    seen: list[ConflictInfo] = []
    store = await open_store(conflict_policy=policy, on_conflict=seen.append)
    worker = worker_of(store)
    # read first: the writes are then based on "absent" and numbered from 1 (a blind first
    # set is based on "not yet known", with a version of its own; see set_reads_base)
    assert await store.get(OWNER, "same") is None
    assert await store.get(OWNER, "moved") is None
    await store.set(OWNER, "same", 1)
    await store.set(OWNER, "moved", 1)
    await store.flush()
    await store.set(OWNER, "same", 2)
    await store.set(OWNER, "moved", 2)
    await worker.write_batch(worker.collect_dirty())  # committed; its outcomes are lost
    await store.set(OWNER, "moved", 3)  # and the chain moved on before the retry
    report = await store.flush()
    assert sorted((o.row.key, o.resolution, o.conflict) for o in report.outcomes) == [
        ("moved", "written", False), ("same", "written", False)]
    assert (seen, store.stats().conflicts) == ([], 0)
    async with central_reader(central_url) as reader:
        same = await central_row(reader, "same")
        moved = await central_row(reader, "moved")
    assert same is not None
    assert moved is not None
    assert (orjson.loads(same.data or b""), same.version) == (2, 2)
    assert (orjson.loads(moved.data or b""), moved.version) == (3, 3)
    for key in ("same", "moved"):
        record = await store.record(OWNER, key)
        assert record is not None
        assert record.flush_state == FlushState.FLUSHED


# -- two stores racing on one key ----------------------------------------------------------


async def test_race_under_reject_the_central_record_wins(
    open_store: StoreFactory, central_url: str,
) -> None:
    seen: list[ConflictInfo] = []
    a = await open_store(triggerer_id="a")
    b = await open_store(triggerer_id="b", on_conflict=seen.append)
    await a.set(OWNER, "k", "from a")
    await b.set(OWNER, "k", "from b")  # neither has flushed: both based on "no record"
    assert (await a.flush()).written == 1
    report = await b.flush()
    assert (report.written, report.adopted, report.conflicts) == (0, 1, 1)

    assert await b.get(OWNER, "k") == "from a"  # the local record was replaced
    record = await b.record(OWNER, "k")
    assert record is not None
    assert (record.version, record.updated_by, record.flush_state) == (
        1, "a", FlushState.CONFLICT)
    assert b.stats().conflicts == 1
    assert [(i.owner, i.key, i.policy, i.winner, i.local_version, i.central_version,
             json_of(i.local_data), json_of(i.central_data)) for i in seen] == [
        (OWNER, "k", "reject", "central", 1, 1, "from b", "from a")]
    async with central_reader(central_url) as reader:
        row = await central_row(reader, "k")
        assert row is not None
        assert (orjson.loads(row.data or b""), row.version, row.updated_by) == (
            "from a", 1, "a")

        # now based on the central record, b writes without conflict
        await b.set(OWNER, "k", "b again")
        report = await b.flush()
        assert (report.written, report.conflicts) == (1, 0)
        assert await central_value(reader, "k") == "b again"

        # a `central` write based on a stale record (a still holds v1) is refused, says so,
        # and leaves a with the central record
        with pytest.raises(WriteRejected, match="another writer owns it now"):
            await a.set(OWNER, "k", "a, late", durability="central")
        assert await a.get(OWNER, "k") == "b again"
        assert a.stats().conflicts == 1
        assert await central_value(reader, "k") == "b again"
    assert len(seen) == 1  # the callback is b's alone


async def test_under_reject_writes_made_during_the_refused_flush_are_reported_replaced(
    open_store: StoreFactory, central_url: str,
) -> None:
    """Found by the failover race (tests/faults): the central record replaces the writes made
    while the refused flush ran too, and the conflict used to name only the flushed row, so
    the latest acknowledged write vanished without a report naming it."""
    seen: list[ConflictInfo] = []
    a = await open_store(triggerer_id="a")
    b = await open_store(triggerer_id="b", on_conflict=seen.append)
    await a.set(OWNER, "k", "from a")
    await b.set(OWNER, "k", "b1")
    await a.flush()
    worker = worker_of(b)
    rows = worker.collect_dirty()
    await b.set(OWNER, "k", "b2")  # acknowledged while the flush is in flight
    worker.mark_clean(await worker.write_batch(rows))
    assert await b.get(OWNER, "k") == "from a"
    assert [(i.winner, i.local_version, json_of(i.local_data), json_of(i.central_data))
            for i in seen] == [("central", 2, "b2", "from a")]
    assert (b.stats().conflicts, b.stats().dirty_keys) == (1, 0)
    async with central_reader(central_url) as reader:
        assert await central_value(reader, "k") == "from a"


async def crashed_after_a_flush_outran_its_commit(
    open_store: StoreFactory, tmp_path: Path, policy: str, *, clean: bool,
) -> Path:
    """A cache file as a SIGKILL leaves it when a flush took two versions (v2, v3: 110, 120)
    whose local commit never came: the file holds v1 = 100 (its mark-clean committed when
    `clean`, else still dirty), the central DB v3 = 120, both by triggerer "t"."""
    a = await open_store(triggerer_id="t", memory_window=3600, conflict_policy=policy)
    assert await a.get(OWNER, "wm") is None  # read first: versions from 1
    await a.set(OWNER, "wm", 100)  # committed locally
    await a.flush()
    if clean:
        await a.sync_local()  # the mark-clean reaches the file
    await a.set(OWNER, "wm", 110, durability="memory")  # not committed locally...
    await a.set(OWNER, "wm", 120, durability="memory")
    await a.flush()  # ...but in the central DB: v3 = 120
    crashed = tmp_path / "crashed.db"
    for suffix in ("", "-wal"):
        source = Path(f"{a.settings.resolved_cache_path}{suffix}")
        with contextlib.suppress(FileNotFoundError):
            shutil.copy(source, f"{crashed}{suffix}")
    return crashed


async def central_wm(central_url: str) -> tuple[Any, int]:
    async with central_reader(central_url) as reader:
        row = await central_row(reader, "wm")
    assert row is not None
    return orjson.loads(row.data or b""), row.version


@pytest.mark.parametrize(("policy", "after_restart"), [
    ("reject", 105), ("max", 130), ("max", 105)])
async def test_a_write_acknowledged_after_a_crash_is_not_replaced_by_the_lost_chain(
    open_store: StoreFactory, central_url: str, tmp_path: Path, policy: str,
    after_restart: int,
) -> None:
    """Found while building the crash harness (tests/faults): after the restart the file is
    at v1, the central DB at v3 by the same writer (a flush outran the local commit of two
    versions). The restarted store's acknowledged write (its v2) was replaced by the lost v3
    at the next flush, silently. The newer write now stays, under max too when it lowers the
    value: it is the writer's own chain."""
    crashed = await crashed_after_a_flush_outran_its_commit(
        open_store, tmp_path, policy, clean=True)
    b = await open_store(triggerer_id="t", cache_path=crashed, conflict_policy=policy)
    assert await b.get(OWNER, "wm") == 100
    assert await b.set(OWNER, "wm", after_restart) == 2  # acknowledged: in b's file
    report = await b.flush()
    assert await b.get(OWNER, "wm") == after_restart
    assert report.conflicts == 0
    assert await central_wm(central_url) == (after_restart, 4)


@pytest.mark.parametrize(("policy", "after_restart"), [
    ("reject", 105), ("max", 130), ("max", 105)])
async def test_a_write_made_while_a_leftover_row_meets_the_lost_chain_stays(
    open_store: StoreFactory, central_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    policy: str, after_restart: int,
) -> None:
    """The same crash, the file's v1 still dirty: the restart's flush of that leftover row
    rightly takes central's v3, but a write acknowledged while that flush ran was replaced
    with it. It now goes out next, based on v3."""
    crashed = await crashed_after_a_flush_outran_its_commit(
        open_store, tmp_path, policy, clean=False)
    monkeypatch.setattr(SyncWorker, "kick", lambda self: None)  # flushes step by step here
    b = await open_store(triggerer_id="t", cache_path=crashed, conflict_policy=policy)
    worker = worker_of(b)
    rows = worker.collect_dirty()
    assert [(r.key, r.version, r.base_version) for r in rows] == [("wm", 1, 0)]
    assert await b.set(OWNER, "wm", after_restart) == 2  # acknowledged during the flush
    worker.mark_clean(await worker.write_batch(rows))
    assert await b.get(OWNER, "wm") == after_restart
    report = await b.flush()
    assert await b.get(OWNER, "wm") == after_restart
    assert report.conflicts == 0
    assert await central_wm(central_url) == (after_restart, 4)


async def test_race_under_last_writer_wins_the_later_flush_wins(
    open_store: StoreFactory, central_url: str,
) -> None:
    seen: list[ConflictInfo] = []
    a = await open_store(triggerer_id="a", conflict_policy="last_writer_wins")
    b = await open_store(triggerer_id="b", conflict_policy="last_writer_wins",
                         on_conflict=seen.append)
    assert await a.get(OWNER, "k") is None  # read first: versions from 1
    assert await b.get(OWNER, "k") is None
    await a.set(OWNER, "k", "from a")
    await b.set(OWNER, "k", "from b")
    await b.set(OWNER, "k", "from b, again")
    await a.flush()
    report = await b.flush()
    assert (report.written, report.conflicts) == (1, 1)
    # the callback is told what the winning write overwrote: a's record
    assert [(i.winner, i.policy, json_of(i.local_data), json_of(i.central_data),
             i.central_version) for i in seen] == [
        ("local", "last_writer_wins", "from b, again", "from a", 1)]
    async with central_reader(central_url) as reader:
        row = await central_row(reader, "k")
    assert row is not None
    assert (orjson.loads(row.data or b""), row.updated_by) == ("from b, again", "b")
    # above the central record it replaced (a's v1), and no lower than b's own chain (v2)
    assert row.version > 1
    assert row.version >= 2
    record = await b.record(OWNER, "k")
    assert record is not None
    assert (record.value, record.version, record.central_version) == (
        "from b, again", row.version, row.version)
    # a keeps its own value until it reloads the owner (a trigger moving back to it)
    assert await a.get(OWNER, "k") == "from a"
    await a.load(OWNER)
    assert await a.get(OWNER, "k") == "from b, again"


async def test_race_under_max_never_moves_the_watermark_backwards(
    open_store: StoreFactory, central_url: str,
) -> None:
    seen: list[tuple[str, ConflictInfo]] = []
    a = await open_store(triggerer_id="a", conflict_policy="max",
                         on_conflict=lambda info: seen.append(("a", info)))
    b = await open_store(triggerer_id="b", conflict_policy="max",
                         on_conflict=lambda info: seen.append(("b", info)))
    history: list[int] = []
    async with central_reader(central_url) as reader:
        async def flush(store: StateStore) -> None:
            await store.flush()
            history.append(await central_value(reader, "wm"))

        await a.set(OWNER, "wm", 10)
        await b.set(OWNER, "wm", 5)
        await flush(a)
        await flush(b)  # stale and lower: the central record wins, b adopts it
        assert await b.get(OWNER, "wm") == 10
        await b.set(OWNER, "wm", 7)  # based on the current record, but lower: refused too
        await flush(b)
        assert await b.get(OWNER, "wm") == 10
        await a.set(OWNER, "wm", 20)
        await b.set(OWNER, "wm", 15)  # a zombie that lost the trigger, flushing late
        await flush(a)
        await flush(b)
        await b.set(OWNER, "wm", 30)  # based on the current record and greater: no conflict
        await flush(b)
        await a.set(OWNER, "wm", 25)  # a is stale now (it holds v2) and lower
        await flush(a)
        assert await a.get(OWNER, "wm") == 30
        await b.set(OWNER, "wm", 40)
        await flush(b)
        await a.set(OWNER, "wm", 50)  # stale (a holds v3, central is at v4) but greater
        await flush(a)
        assert history == [10, 10, 10, 20, 20, 30, 30, 40, 50]
        row = await central_row(reader, "wm")
        assert row is not None
        assert (row.updated_by, orjson.loads(row.data or b"")) == ("a", 50)
    assert [(who, i.winner, json_of(i.local_data), json_of(i.central_data))
            for who, i in seen] == [
        ("b", "central", 5, 10), ("b", "central", 7, 10), ("b", "central", 15, 20),
        ("a", "central", 25, 30), ("a", "local", 50, 40)]
    assert all(i.policy == "max" for _, i in seen)


async def test_a_policy_mapping_picks_each_owners_policy_by_glob(
    open_store: StoreFactory, central_url: str,
) -> None:
    policy = {"asset_watcher:*": "max:offset", "*": "reject"}
    a = await open_store(triggerer_id="a", conflict_policy=policy)
    b = await open_store(triggerer_id="b", conflict_policy=policy)
    for store, offset in ((a, 9), (b, 4)):
        await store.set(OWNER, "cursor", {"offset": offset, "by": store.triggerer_id})
        await store.set("dag:etl/load", "cursor", {"offset": offset, "by": store.triggerer_id})
    await b.flush()
    report = await a.flush()  # a's offset is greater: it wins under max:offset only
    assert sorted((o.row.owner, o.resolution, o.policy) for o in report.outcomes) == [
        (OWNER, "written", "max:offset"), ("dag:etl/load", "adopted", "reject")]
    async with central_reader(central_url) as reader:
        assert await central_value(reader, "cursor") == {"offset": 9, "by": "a"}
        assert await central_value(reader, "cursor", "dag:etl/load") == {"offset": 4, "by": "b"}


# -- the randomized failover schedule ------------------------------------------------------

_KINDS = ("set", "set", "zombie", "flush", "load", "handover", "restart")
_step = st.tuples(st.sampled_from(_KINDS), st.integers(0, 2), st.integers(1, 5))
# The schedules only need real files, not a durable disk: tmpfs spares them the fsyncs.
_SCHEDULE_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
#: random schedules tried (``LOCALSTATE_FAILOVER_SCHEDULES``): 200 in the suite, fewer in the
#: quick tier (scripts/test --quick), which is a contributor's inner loop
FAILOVER_SCHEDULES = int(os.environ.get("LOCALSTATE_FAILOVER_SCHEDULES", "200"))


@settings(max_examples=FAILOVER_SCHEDULES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(stores=st.integers(2, 3), schedule=st.lists(_step, min_size=1, max_size=20))
def test_the_watermark_never_goes_backwards_under_a_random_failover_schedule(
    stores: int, schedule: list[tuple[str, int, int]],
) -> None:
    with tempfile.TemporaryDirectory(prefix="localstate-failover-", dir=_SCHEDULE_TMP) as tmp:
        asyncio.run(_run_failover(Path(tmp), stores, schedule))


async def _run_failover(tmp: Path, n: int, schedule: list[tuple[str, int, int]]) -> None:
    """Stores take a trigger's watermark over from each other; stale ones keep writing.

    A small model says what the central DB must hold. A flush of a dirty value by the store
    whose record the central DB holds is that writer's own chain: it lands, even lower (a
    "zombie" step of the current writer is a trigger moving its own watermark back). Against
    another writer's record the greater value stays: a write based on that record goes in
    when not lower, a stale one only when greater. The assertion that matters: the central
    value never decreases but by a write of the writer that holds it.

    To keep 200 schedules fast the stores share one `CentralStore` (one connection pool: opening
    one migrates the schema, the slow part); each has its own cache file and triggerer id, and
    the fencing under test is in the SQL each flush sends.
    """
    url = f"sqlite:///{tmp / 'central.db'}"

    opened: list[StateStore] = []
    async with central_reader(url) as reader:

        async def open_(i: int) -> StateStore:
            return await StateStore.open(
                sink=reader, cache_path=tmp / f"t{i}.db", triggerer_id=f"t{i}",
                conflict_policy="max", flush_interval=3600, durability="memory",
            )

        try:
            for i in range(n):
                opened.append(await open_(i))
            # the model of the central record: its value, its writer, and a generation that
            # moves with every write it takes (what a store's base is compared with)
            central: int | None = None
            central_by: int | None = None
            generation = 0
            # per store: (value, dirty, generation of the central record it is based on)
            local: list[tuple[int, bool, int] | None] = [None] * n
            seen: list[tuple[int, int]] = []  # (value, writer) of each central record

            def flushed(i: int) -> None:
                nonlocal central, central_by, generation
                known = local[i]
                if known is None or not known[1]:
                    return
                value, _dirty, base = known
                if central_by == i:
                    assert base == generation  # the writer's own chain is never stale here
                if central is None or central_by == i or value > central or (
                        value == central and base == generation):
                    central, central_by, generation = value, i, generation + 1
                local[i] = (central, False, generation)

            def based(i: int) -> int:
                """The base of a write store i makes now: its record's, or what it reads."""
                known = local[i]
                return generation if known is None else known[2]

            for kind, i, amount in schedule:
                i %= n
                store = opened[i]
                if kind in ("set", "zombie"):
                    current = await store.get(OWNER, "wm", 0)
                    value = current + amount if kind == "set" else current - amount
                    base = based(i)
                    await store.set(OWNER, "wm", value)
                    local[i] = (value, True, base)
                elif kind == "flush":
                    await store.flush()
                    flushed(i)
                elif kind == "restart":
                    await store.close()
                    flushed(i)  # close flushed it
                    store = opened[i] = await open_(i)
                else:  # "load", or "handover": the trigger moves to store i
                    await store.load(OWNER)
                    known = local[i]
                    if central is not None and (known is None or not known[1]):
                        local[i] = (central, False, generation)
                    if kind == "handover":
                        watermark = await store.get(OWNER, "wm", 0)
                        if central is not None and (known is None or not known[1]):
                            # the new owner continues from the last flushed watermark
                            assert watermark == central
                        base = based(i)
                        await store.set(OWNER, "wm", watermark + amount)
                        local[i] = (watermark + amount, True, base)
                row = await central_row(reader, "wm")
                if row is None:
                    assert central is None
                else:
                    actual: int = orjson.loads(row.data or b"")
                    assert (actual, row.updated_by) == (central, f"t{central_by}")
                    assert central_by is not None
                    if seen and actual < seen[-1][0]:
                        assert central_by == seen[-1][1], (seen, actual)  # its own chain
                    seen.append((actual, central_by))
                known = local[i]
                if known is not None:
                    assert await store.get(OWNER, "wm") == known[0]
            # every store flushes at the end: the model says what remains
            for i, store in enumerate(opened):
                await store.flush()
                flushed(i)
            assert await central_value(reader, "wm") == central
            assert all(s.stats().dirty_keys == 0 for s in opened)
        finally:
            for store in opened:
                await store.close()


# -- read-through, restarts --------------------------------------------------------------


async def test_a_replacement_store_reads_through_to_the_last_flushed_value(
    open_store: StoreFactory, central_url: str,
) -> None:
    a = await open_store(triggerer_id="a")
    await a.set(OWNER, "watermark", 41)
    await a.set(OWNER, "cursor", {"page": 3})
    await a.set("other", "x", 1)
    await a.flush()
    await a.close()

    b = await open_store(triggerer_id="b")  # another triggerer, its own (empty) cache file
    assert b.stats().keys_in_memory == 0
    assert await b.get(OWNER, "watermark") == 41
    assert await b.get(OWNER, "cursor") == {"page": 3}
    queries = b.stats().read_through_queries
    assert queries >= 1
    assert await b.get(OWNER, "watermark") == 41  # now cached: no query
    assert b.stats().read_through_queries == queries
    record = await b.record(OWNER, "watermark")
    assert record is not None
    assert (record.version, record.updated_by, record.flush_state) == (
        1, "a", FlushState.FLUSHED)
    # it continues from the watermark, based on the central version: no conflict
    await b.set(OWNER, "watermark", 42)
    report = await b.flush()
    assert (report.written, report.conflicts) == (1, 0)

    # a third one preloads the owner in one query
    c = await open_store(triggerer_id="c")
    with StatementLog(c).watching() as log:
        assert await c.load(OWNER) == 2
    assert len(log.of_kind("SELECT")) == 1
    items = [(r.key, r.value, r.version) async for r in c.items(OWNER)]
    assert items == [("cursor", {"page": 3}, 1), ("watermark", 42, 2)]
    with StatementLog(c).watching() as log:
        assert await c.get(OWNER, "watermark") == 42
    assert log.statements == []
    async with central_reader(central_url) as reader:
        row = await central_row(reader, "watermark")
    assert row is not None
    assert (row.version, row.updated_by) == (2, "b")


async def test_unflushed_writes_survive_a_restart_and_are_flushed_at_start(
    db_server: PostgresServer | MysqlServer, tmp_path: Path,
) -> None:
    url = new_database(db_server, "restart")
    cache = tmp_path / "t.db"
    options: dict[str, Any] = {
        "central_url": url, "cache_path": cache, "triggerer_id": "t", "flush_interval": 3600,
        "close_timeout": 1,
    }
    store = await StateStore.open(**options)
    try:
        await store.set(OWNER, "before", 1)
        await store.flush()
        db_server.stop()
        try:
            # acknowledged locally; "wm" is not in memory and its central record cannot be
            # read, so its versions start above any the central DB can hold (#21)
            versions = [await store.set(OWNER, "wm", i) for i in range(1, 6)]
            assert versions == list(range(versions[0], versions[0] + 5))
            assert versions[0] > 1
            await store.set(OWNER, "before", 2)
            with pytest.raises(CentralUnavailable):
                await store.flush()
            assert store.stats().last_error is not None
        finally:
            try:
                await store.close()  # cannot flush: the writes stay in the cache file
            finally:
                db_server.start()
    finally:
        await store.close()
    assert local_rows(cache) == {  # dirty on disk
        "before": (2, 2, 1), "wm": (5, versions[-1], UNKNOWN_BASE)}
    async with central_reader(url) as reader:
        assert await central_value(reader, "before") == 1
        assert await central_row(reader, "wm") is None

        store = await StateStore.open(**options)  # the same cache: no explicit flush below
        try:
            async def flushed_at_start() -> bool:
                return bool(await central_value(reader, "wm") == 5)

            await eventually(flushed_at_start, "the reopened store to flush its backlog")
            wm = await central_row(reader, "wm")
            before = await central_row(reader, "before")
            assert wm is not None
            assert before is not None
            assert (wm.version, before.version, orjson.loads(before.data or b"")) == (
                versions[-1], 2, 2)
            await eventually(lambda: _async(store.stats().dirty_keys == 0), "clean keys")
            assert store.stats().conflicts == 0
        finally:
            await store.close()
    assert local_rows(cache) == {"before": (2, 2, 2), "wm": (5, versions[-1], versions[-1])}


async def _async(value: bool) -> bool:
    return value


# -- outages -------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_mode", ["fast", "immediate"])
async def test_an_outage_during_a_write_loop_loses_and_duplicates_nothing(
    db_server: PostgresServer | MysqlServer, tmp_path: Path, stop_mode: str,
) -> None:
    url = new_database(db_server, "outage", crash_safe=True)
    store = await StateStore.open(
        central_url=url, cache_path=tmp_path / "t.db", triggerer_id="t",
        flush_interval=0.05, durability="local",
    )
    keys = [f"k{j:02}" for j in range(20)]
    counts = dict.fromkeys(keys, 0)
    last: dict[str, int] = {}
    done = asyncio.Event()

    async def write_loop() -> None:
        i = 0
        while not done.is_set():
            i += 1
            batch = [k for j, k in enumerate(keys) if i % (j % 4 + 1) == 0]
            versions = await asyncio.gather(*(store.set(OWNER, k, i) for k in batch))
            for k, version in zip(batch, versions, strict=True):
                counts[k] += 1
                last[k] = i
                assert version == counts[k]  # acknowledged, at the next local version
            await asyncio.sleep(0.002)

    def total() -> int:
        return sum(counts.values())

    try:
        async with central_reader(url) as reader:
            writer = asyncio.create_task(write_loop())
            try:
                async def some_flushed() -> bool:
                    return len(await reader.read_owner(OWNER)) == len(keys)

                await eventually(some_flushed, "flushes before the outage")
                await asyncio.to_thread(db_server.stop, stop_mode)
                try:
                    await eventually(lambda: _async(store.stats().last_error is not None),
                                     "the worker to notice the outage")
                    during = total()

                    async def sets_go_on() -> bool:
                        if writer.done():
                            writer.result()  # a failed set fails the test here
                        return total() >= during + 200

                    await eventually(sets_go_on, "sets to keep working during the outage")
                    stats = store.stats()
                    assert stats.central_errors > 0
                    assert stats.dirty_keys > 0
                    assert stats.oldest_unflushed_s > 0.0
                    assert not writer.done()
                finally:
                    await asyncio.to_thread(db_server.start)
                await eventually(lambda: _async(store.stats().last_error is None),
                                 "a flush to succeed after the restart")
            finally:
                done.set()
                await writer  # re-raises any failed set
            await flush_once_back(store)
            assert store.stats().dirty_keys == 0
            rows = {r.key: r for r in await reader.read_owner(OWNER)}
    finally:
        await store.close()
    assert sorted(rows) == keys
    # every acknowledged write arrived once: one central version per set, the last value
    assert {k: (r.version, orjson.loads(r.data or b"")) for k, r in rows.items()} == {
        k: (counts[k], last[k]) for k in keys}
    assert store.stats().conflicts == 0


async def test_central_durability_times_out_when_the_db_is_down_and_keeps_the_write(
    db_server: PostgresServer | MysqlServer, tmp_path: Path,
) -> None:
    url = new_database(db_server, "central")
    store = await StateStore.open(
        central_url=url, cache_path=tmp_path / "t.db", triggerer_id="t", flush_interval=3600,
        central_timeout=1,
    )
    try:
        async with central_reader(url) as reader:
            assert await store.set(OWNER, "k", "before", durability="central") == 1
            assert await central_value(reader, "k") == "before"  # in the DB on return
            db_server.stop()
            try:
                with pytest.raises(CentralUnavailable, match="kept in the local cache"):
                    await store.set(OWNER, "k", "during", durability="central")
                assert await store.get(OWNER, "k") == "during"
                record = await store.record(OWNER, "k")
                assert record is not None
                assert (record.version, record.flush_state) == (2, FlushState.DIRTY)
                # stay down until the worker's retry backoff is longer than central_timeout.
                # Its first failure may come after the timeout above (a flush attempt slower
                # than central_timeout on a loaded machine: the next test forces it), so the
                # error is looked for only once the worker has failed.
                await eventually(lambda: _async(store.stats().central_errors >= 5),
                                 "the worker to back off")
                assert store.stats().last_error is not None
            finally:
                db_server.start()
            # the local file has it (it was committed locally before the central wait)
            assert local_rows(tmp_path / "t.db")["k"] == ("during", 2, 1)
            await flush_once_back(store)
            row = await central_row(reader, "k")
            assert row is not None
            assert (orjson.loads(row.data or b""), row.version) == ("during", 2)
            # and central durability works again at once: the successful flush ended the
            # worker's backoff (it used to sleep it out, ignoring the central write's kick)
            assert await store.set(OWNER, "k", "after", durability="central") == 3
            assert await central_value(reader, "k") == "after"
    finally:
        await store.close()


async def test_central_durability_times_out_while_the_flush_is_still_trying(
    open_store: StoreFactory, central_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush slower than `central_timeout`: the write is refused as not yet central at the
    timeout, before the flush has an error to report ("no error yet"), and the flush then
    carries it to the central DB (an assertion on `last_error` right after the timeout failed
    once under load for this reason)."""
    write_batch = SyncWorker.write_batch
    started, finished = asyncio.Event(), asyncio.Event()

    async def slow_write_batch(self: SyncWorker, rows: Any) -> Any:
        started.set()
        await asyncio.sleep(1.5)
        try:
            return await write_batch(self, rows)
        finally:
            finished.set()

    store = await open_store(flush_interval=3600, central_timeout=1)
    monkeypatch.setattr(SyncWorker, "write_batch", slow_write_batch)
    with pytest.raises(CentralUnavailable, match=r"no error yet.*kept in the local cache"):
        await store.set(OWNER, "k", "slow", durability="central")
    assert started.is_set()
    assert not finished.is_set()
    assert store.stats().last_error is None
    await asyncio.wait_for(finished.wait(), 30)
    async with central_reader(central_url) as reader:
        assert await central_value(reader, "k") == "slow"


async def test_central_durability_holds_when_a_flush_overtakes_the_local_commit(
    open_store: StoreFactory, central_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow disk: the worker flushes the new version while its local commit is in flight.

    The `central` waiter must still be settled by that flush (it used to be registered only
    after the local commit, so nothing ever settled it and the set timed out although the
    central DB held the write).
    """
    commit = LocalCache._commit_batch

    async def slow_commit(self: LocalCache, *batch: Any) -> Any:
        await asyncio.sleep(0.05)
        return await commit(self, *batch)

    monkeypatch.setattr(LocalCache, "_commit_batch", slow_commit)
    store = await open_store(flush_interval=0.005, central_timeout=10)
    async with central_reader(central_url) as reader:
        for i in range(1, 6):
            assert await store.set(OWNER, "k", i, durability="central") == i
            row = await central_row(reader, "k")
            assert row is not None
            assert (orjson.loads(row.data or b""), row.version) == (i, i)
    assert store.stats().conflicts == 0


# -- direct mode -------------------------------------------------------------------------


async def test_direct_mode_is_one_central_transaction_per_set(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(enabled=False)
    other = await open_store(enabled=False, triggerer_id="other")
    with StatementLog(store).watching() as log:
        versions = [await store.set(OWNER, "k", i) for i in range(5)]
        versions.append(await store.set(OWNER, "j", "x"))
    assert versions == [1, 2, 3, 4, 5, 1]
    assert log.commits == 6
    assert [rows_carried_direct(p) for _, p in log.of_kind("INSERT")] == [1] * 6
    async with central_reader(central_url) as reader:
        assert await central_value(reader, "k") == 4  # in the DB as soon as set returns
    # get reads the central DB every time: a write by another store is seen at once
    with StatementLog(store).watching() as log:
        assert await store.get(OWNER, "k") == 4
        await other.set(OWNER, "k", "from other")
        assert await store.get(OWNER, "k") == "from other"
    assert len(log.of_kind("SELECT")) == 2
    assert log.commits == 0  # reads commit nothing
    stats = store.stats()
    assert (stats.cache_enabled, stats.central_transactions, stats.dirty_keys) == (False, 6, 0)
    assert (await store.flush()).rows == 0
    assert await store.delete(OWNER, "j")
    assert await store.get(OWNER, "j") is None


async def test_direct_mode_compare_and_set_is_one_conditional_statement(
    open_store: StoreFactory, central_url: str,
) -> None:
    store = await open_store(enabled=False)
    other = await open_store(enabled=False, triggerer_id="other")
    with StatementLog(store).watching() as log:
        assert await store.compare_and_set(OWNER, "k", "a", expected_version=0) == 1
    assert log.commits == 1
    with pytest.raises(VersionConflict) as caught:
        await store.compare_and_set(OWNER, "k", "b", expected_version=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    assert await other.compare_and_set(OWNER, "k", "c", expected_version=1) == 2
    with pytest.raises(VersionConflict) as caught:  # the other store's write is seen at once
        await store.compare_and_set(OWNER, "k", "d", expected_version=1)
    assert (caught.value.expected, caught.value.actual) == (1, 2)
    assert await store.compare_and_set(OWNER, "k", "e", expected_version=2) == 3
    async with central_reader(central_url) as reader:
        assert await central_value(reader, "k") == "e"
    assert await store.delete(OWNER, "k")
    assert await store.compare_and_set(OWNER, "k", "f", expected_version=0) == 5  # tombstone
    with pytest.raises(InvalidInput, match="expected_version"):
        await store.compare_and_set(OWNER, "k", "g", expected_version=2**64)
    assert await store.get(OWNER, "k") == "f"


async def test_compare_and_set_survives_the_cache_toggle_both_ways(
    open_store: StoreFactory,
) -> None:
    store = await open_store()
    assert await store.compare_and_set(OWNER, "k", 1, expected_version=0) == 1
    await store.reconfigure(store.settings.replace(enabled=False))
    assert await store.compare_and_set(OWNER, "k", 2, expected_version=1) == 2
    await store.reconfigure(store.settings.replace(enabled=True))
    assert await store.compare_and_set(OWNER, "k", 3, expected_version=2) == 3
    with pytest.raises(VersionConflict):
        await store.compare_and_set(OWNER, "k", 4, expected_version=2)
    assert await store.get(OWNER, "k") == 3


def rows_carried_direct(parameters: Any) -> int:
    """Direct-mode inserts carry one row of scalar parameters."""
    values = list(parameters.values()) if isinstance(parameters, dict) else list(parameters)
    assert not any(isinstance(v, list) for v in values)
    return 1


async def test_an_answer_that_came_while_the_loop_did_not_run_is_kept_by_the_flush_timer(
) -> None:
    """`wait_awake`: the loop stops for longer than the timeout (a stopped process, here a
    blocked loop), the answer arrives meanwhile and needs one more turn to be delivered:
    `asyncio.wait_for` throws it away, `wait_awake` returns it; an answer that never comes
    still times out."""
    loop = asyncio.get_running_loop()

    def answered_during_a_stop() -> Awaitable[int]:
        answer: asyncio.Future[int] = loop.create_future()
        loop.call_later(0.1, answer.set_result, 7)
        loop.call_soon(time.sleep, 2.0)  # the loop does not run: 0.1 s and 1 s pass

        async def call() -> int:
            value = await answer
            await asyncio.sleep(0)  # the rest of the call after its answer (as after COMMIT)
            return value
        return call()

    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(answered_during_a_stop(), 1.0)
    assert await wait_awake(answered_during_a_stop(), 1.0) == 7
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await wait_awake(loop.create_future(), 0.3)
    assert time.monotonic() - started >= 0.3
