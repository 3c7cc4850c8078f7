"""`LocalCache` on its own: real SQLite files.

Files a cache cannot use (garbage, truncated, foreign, newer schema, read-only, held by a live
process) are in the fault suite, `tests/faults/test_disk_faults.py`.

The file is always checked from the outside too, with a separate `sqlite3` connection: what a
test asserts is what a restart (or the CLI) would find on disk, not what the cache believes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localstate._cache.cache_file import APPLICATION_ID, SCHEMA_VERSION
from localstate._cache.entry import NOT_DECODED, Entry, StateKey
from localstate._cache.local_cache import LocalCache
from localstate._core.codec import encode
from localstate._core.rows import EventRow
from localstate.errors import (
    CacheError,
    CacheLocked,
    CacheWriteFailed,
)

OWNER_ID = "triggerer-test"

# (value, version, synced_version) as the file holds them
DiskRow = tuple[str | None, int, int]


def make_entry(value: Any, version: int, synced: int = 0, *, deleted: bool = False) -> Entry:
    data = None if deleted else encode(value)
    obj = None if deleted else (value if type(value) in (int, str, float, bool) else NOT_DECODED)
    return Entry(data, obj, version, time.time(), OWNER_ID, synced)


def read_rows(path: Path) -> dict[StateKey, DiskRow]:
    """Every row of the cache file, read by a connection of our own."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT owner, key, value, version, synced_version FROM state")
        return {(o, k): (v, ver, synced) for o, k, v, ver, synced in rows}


def pragma(path: Path, name: str) -> Any:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


async def open_cache(path: Path, **options: Any) -> LocalCache:
    return await LocalCache.open(path, owner_id=OWNER_ID, **options)


async def closed_cache_with_rows(path: Path, rows: int) -> None:
    """A real cache file holding `rows` rows, closed (its WAL checkpointed into the file)."""
    cache = await open_cache(path)
    try:
        await asyncio.gather(
            *(cache.commit(("owner", f"k{i}"), make_entry("x" * 200 + str(i), 1))
              for i in range(rows))
        )
    finally:
        await cache.close()


# -- opening: schema and pragmas ---------------------------------------------------------------


@pytest.mark.parametrize(("local_sync", "expected"), [("full", 2), ("normal", 1)])
async def test_open_creates_schema_and_sets_pragmas(
    tmp_path: Path, local_sync: str, expected: int
) -> None:
    path = tmp_path / "sub" / "folder" / "cache.db"  # the folders are created too
    cache = await open_cache(path, local_sync=local_sync)
    try:
        assert path.is_file()
        assert cache.path == path
        # persistent, in the file: visible to any other connection
        assert pragma(path, "application_id") == APPLICATION_ID
        assert pragma(path, "user_version") == SCHEMA_VERSION
        assert pragma(path, "journal_mode") == "wal"
        assert read_rows(path) == {}
        # `synchronous` is a per-connection setting (another connection reports its own
        # default), so it has to be read on the cache's own connection
        conn = cache._conn
        assert conn is not None
        async with conn.execute("PRAGMA synchronous") as cursor:
            row = await cursor.fetchone()
        assert row is not None
        assert row[0] == expected
    finally:
        await cache.close()
    # an existing cache reopens as it is: nothing is re-created or wiped
    await closed_cache_with_rows(tmp_path / "other.db", 3)
    again = await open_cache(tmp_path / "other.db")
    try:
        assert len(await again.load()) == 3
    finally:
        await again.close()


async def test_empty_file_is_initialised(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    path.write_bytes(b"")  # e.g. created by `touch`: a SQLite file with no tables yet
    cache = await open_cache(path)
    try:
        await cache.commit(("o", "k"), make_entry(1, 1))
    finally:
        await cache.close()
    assert pragma(path, "application_id") == APPLICATION_ID
    assert read_rows(path) == {("o", "k"): ("1", 1, 0)}


async def test_close_is_safe_twice_and_refuses_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = await open_cache(path)
    await cache.commit(("o", "k"), make_entry(1, 1))
    assert not cache.closed
    await cache.close()
    assert cache.closed
    await cache.close()
    assert cache.closed
    assert read_rows(path) == {("o", "k"): ("1", 1, 0)}
    # the writer is gone: a commit must fail at once, not wait forever for a commit
    with pytest.raises(CacheError, match="closed"):
        await asyncio.wait_for(cache.commit(("o", "k"), make_entry(2, 2)), 10)
    # the lock was released: another cache can take the file
    other = await open_cache(path)
    await other.close()


async def test_normal_use_emits_no_resource_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = await open_cache(tmp_path / "cache.db")
        await cache.commit(("o", "a"), make_entry(1, 1))
        cache.stage(("o", "b"), make_entry({"x": 1}, 1))
        await cache.sync_now()
        assert len(await cache.load()) == 2
        await cache.close()
        await cache.close()
        del cache
        gc.collect()
    resource = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert resource == []


# -- left open: the event loop ends, or the interpreter exits, with the cache open ----------


def _never_closed(path: Path) -> str:
    return f"the local cache {path} was never closed"


def _reopens(path: Path) -> bool:
    """Whether another cache opens `path` (its lock was released) and then closes it."""
    async def reopen() -> None:
        await (await open_cache(path)).close()

    asyncio.run(reopen())
    return True


def test_an_event_loop_ending_with_the_cache_open_commits_and_closes_it(tmp_path: Path) -> None:
    """``asyncio.run`` cancels the writer: it commits what is staged (the memory window's
    writes), closes the file, releases its lock, and warns naming the file."""
    path = tmp_path / "cache.db"

    async def leave_open() -> LocalCache:
        cache = await open_cache(path, memory_window=30.0)
        await cache.commit(("o", "local"), make_entry(1, 1))
        cache.stage(("o", "memory"), make_entry(2, 1))  # due in 30 s: not yet committed
        cache.stage_event(EventRow(1, "o", "e1", '{"n":1}', 1.0))
        return cache

    with pytest.warns(ResourceWarning, match=_never_closed(path)):
        cache = asyncio.run(leave_open())
    assert cache.closed
    assert set(read_rows(path)) == {("o", "local"), ("o", "memory")}
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("SELECT key FROM outbox").fetchall() == [("e1",)]
    assert _reopens(path)


def test_a_loop_ending_mid_commit_commits_that_batch_again(tmp_path: Path) -> None:
    """The writer is cancelled while its commit waits for the file's write lock: that commit
    rolls back, and the batch it carried is committed by the close that follows."""
    path = tmp_path / "cache.db"
    asyncio.run(closed_cache_with_rows(path, 0))
    entries = {("o", f"k{i}"): make_entry(i, 1) for i in range(500)}

    async def cancelled_mid_commit() -> LocalCache:
        cache = await open_cache(path)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # the write lock: the cache's commit waits for it
        cache.stage_many(entries)
        waiter = asyncio.ensure_future(cache.sync_now())
        await asyncio.sleep(0.5)  # the commit is in flight, waiting for the lock
        assert not waiter.done()
        assert cache.commits == 0
        # released while asyncio.run cancels the writer: the waiting commit goes on, then
        # rolls back
        asyncio.get_running_loop().call_later(0.2, blocker.close)
        return cache

    with pytest.warns(ResourceWarning, match=_never_closed(path)):
        cache = asyncio.run(cancelled_mid_commit())
    assert cache.commits == 1  # the abandoned close's commit, not the cancelled one
    assert set(read_rows(path)) == set(entries)
    assert _reopens(path)


def test_a_cache_whose_loop_was_closed_is_committed_and_closed_at_exit(tmp_path: Path) -> None:
    """A loop only stopped and closed (``run_until_complete``, as Airflow's async tasks run)
    cancels nothing: the exit hook closes the cache on a loop of its own."""
    path = tmp_path / "cache.db"

    async def leave_open() -> LocalCache:
        cache = await open_cache(path, memory_window=30.0)
        cache.stage(("o", "memory"), make_entry(2, 1))
        return cache

    loop = asyncio.new_event_loop()
    try:
        cache = loop.run_until_complete(leave_open())
    finally:
        loop.close()
    assert not cache.closed
    assert read_rows(path) == {}
    with pytest.warns(ResourceWarning, match=_never_closed(path)):
        cache.close_at_exit()
    assert cache.closed
    assert set(read_rows(path)) == {("o", "memory")}
    assert _reopens(path)
    cache.close_at_exit()  # closed: nothing more to do
    # the tasks the closed loop left pending (the writer, its wait for the memory window)
    # never run again: close their coroutines, as the interpreter's exit would drop them
    for task in asyncio.all_tasks(loop):
        task.get_coro().close()


def test_a_cache_whose_loop_runs_on_another_thread_is_closed_there_at_exit(
    tmp_path: Path,
) -> None:
    """A loop still running on its own thread (a BlockingStateStore's) ends the writer there."""
    path = tmp_path / "cache.db"
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        cache = asyncio.run_coroutine_threadsafe(
            open_cache(path, memory_window=30.0), loop).result(30)
        loop.call_soon_threadsafe(cache.stage, ("o", "memory"), make_entry(2, 1))
        with pytest.warns(ResourceWarning, match=_never_closed(path)):
            cache.close_at_exit()
        assert cache.closed
        assert set(read_rows(path)) == {("o", "memory")}
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
    assert _reopens(path)


async def test_unclosed_cache_would_warn(tmp_path: Path) -> None:
    """The ResourceWarning check above can fail: an open cache does warn when collected."""
    seen: list[tuple[str, type[Warning]]] = []

    def collect(message: str, category: type[Warning], stacklevel: int = 1) -> None:
        seen.append((message, category))

    cache = await open_cache(tmp_path / "cache.db")
    finalizer: Callable[..., None] = cache.__del__  # what the garbage collector calls
    try:
        finalizer(_warn=collect)
        assert seen == [(f"LocalCache {cache.path} was never closed", ResourceWarning)]
    finally:
        await cache.close()
    finalizer(_warn=collect)
    assert len(seen) == 1  # closed: no further warning


# -- group commit and ordering -----------------------------------------------------------------


async def test_group_commit_batches_concurrent_commits(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = await open_cache(path)
    try:
        await asyncio.gather(
            *(cache.commit(("owner", f"k{i}"), make_entry(i, 1)) for i in range(1000))
        )
        # every commit call has returned, so every row is on disk now, before close()
        rows = read_rows(path)
        assert cache.commits <= 20, f"{cache.commits} commits for 1,000 concurrent writes"
        assert cache.commits >= 1
        assert cache.rows_committed == 1000
        assert cache.staged_count == 0
        assert cache.last_error is None
    finally:
        await cache.close()
    assert rows == {("owner", f"k{i}"): (encode(i), 1, 0) for i in range(1000)}


async def test_mutation_before_commit_is_what_reaches_disk(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = await open_cache(path, memory_window=60.0)
    try:
        e = make_entry("v1", 1)
        cache.stage(("o", "k"), e)
        # the store mutates the shared entry in place for the next write, then commits it
        e.data, e.obj, e.version = encode("v2"), "v2", 2
        await cache.commit(("o", "k"), e)
        assert read_rows(path) == {("o", "k"): ('"v2"', 2, 0)}
        assert cache.commits == 1  # one commit carried both writes
        # a second, distinct entry object staged later replaces the first in the batch
        cache.stage(("o", "j"), make_entry("old", 1))
        cache.stage(("o", "j"), make_entry("new", 2))
        await cache.sync_now()
        assert read_rows(path)[("o", "j")] == ('"new"', 2, 0)
    finally:
        await cache.close()


async def test_later_write_never_overwritten_by_older(tmp_path: Path) -> None:
    """Commits, memory stages and commits in flight interleave; the newest always wins."""
    path = tmp_path / "cache.db"
    rng = random.Random(7)
    cache = await open_cache(path)
    k: StateKey = ("o", "k")
    checked = 0

    async def commit_and_check(version: int) -> None:
        nonlocal checked
        await cache.commit(k, make_entry(version, version))
        # acknowledged: the file holds this version or a later one, never an older one
        on_disk = read_rows(path)[k][1]
        assert on_disk >= version
        checked += 1

    try:
        tasks: list[asyncio.Task[None]] = []
        for version in range(1, 301):
            if version % 3 == 0:
                cache.stage(k, make_entry(version, version))  # a memory write
            else:
                tasks.append(asyncio.create_task(commit_and_check(version)))
            for _ in range(rng.randrange(4)):
                await asyncio.sleep(0)  # let the writer take batches at random points
        await asyncio.gather(*tasks)
        await cache.sync_now()
        assert read_rows(path)[k] == ("300", 300, 0)
        assert checked == len(tasks) == 200
        assert cache.commits < 300  # batched: interleaving still groups writes
    finally:
        await cache.close()
    assert read_rows(path)[k] == ("300", 300, 0)


async def test_failed_commit_is_retried_and_newer_staging_wins(tmp_path: Path) -> None:
    """A commit that fails (here a trigger aborts it) raises, stays staged, and is retried."""
    path = tmp_path / "cache.db"
    cache = await open_cache(path)

    def run_sql(sql: str) -> None:
        # in a thread: the writer's failed transaction may still hold the write lock until
        # the event loop lets it roll back
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            conn.execute(sql)
            conn.commit()

    try:
        await cache.commit(("o", "before"), make_entry(1, 1))
        await asyncio.to_thread(
            run_sql,
            "CREATE TRIGGER fail_poison BEFORE INSERT ON state WHEN NEW.owner = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
        )
        cache.stage(("o", "bystander"), make_entry("b", 1))  # rides in the failing batch
        with pytest.raises(CacheWriteFailed, match="injected failure") as info:
            await cache.commit(("poison", "k"), make_entry("v1", 1))
        assert str(path) in str(info.value)
        assert info.value.path == str(path)
        assert isinstance(cache.last_error, CacheWriteFailed)
        # while it keeps failing, a newer write of the key is staged
        cache.stage(("poison", "k"), make_entry("v2", 2))
        assert ("poison", "k") not in read_rows(path)
        await asyncio.to_thread(run_sql, "DROP TRIGGER fail_poison")
        await asyncio.wait_for(cache.sync_now(), 30)
        rows = read_rows(path)
        assert rows[("poison", "k")] == ('"v2"', 2, 0)  # the retry did not bring back v1
        assert rows[("o", "bystander")] == ('"b"', 1, 0)
        assert rows[("o", "before")] == ("1", 1, 0)
        assert cache.last_error is None
        assert cache.staged_count == 0
    finally:
        await cache.close()


# -- load ---------------------------------------------------------------------------------------


async def test_load_round_trips_entries_and_purges_clean_tombstones(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    written = {
        ("a", "int"): make_entry(41, 3, 2),
        ("a", "str"): make_entry("héllo", 1, 1),
        ("a", "dict"): make_entry({"cursor": [1, 2, {"x": None}]}, 5, 0),
        ("b", "dirty-tombstone"): make_entry(None, 7, 6, deleted=True),
    }
    cache = await open_cache(path)
    try:
        for k, e in written.items():
            await cache.commit(k, e)
        await cache.commit(("b", "gone"), make_entry(1, 1))
        assert ("b", "gone") in read_rows(path)
        # a deletion the central DB holds (version == synced): the row is dropped, not kept
        await cache.commit(("b", "gone"), make_entry(None, 2, 2, deleted=True))
        await cache.commit(("b", "never-stored"), make_entry(None, 4, 4, deleted=True))
    finally:
        await cache.close()
    assert set(read_rows(path)) == set(written)

    cache = await open_cache(path)
    try:
        loaded = await cache.load()
    finally:
        await cache.close()
    assert set(loaded) == set(written)
    for k, e in written.items():
        got = loaded[k]
        assert (got.data, got.version, got.synced_version, got.updated_by, got.updated_at) == (
            e.data, e.version, e.synced_version, e.updated_by, e.updated_at
        ), k
        assert got.dirty == e.dirty
    assert loaded["a", "int"].obj == 41
    assert loaded["a", "str"].obj == "héllo"
    assert loaded["a", "dict"].obj is NOT_DECODED  # containers are decoded afresh per reader
    assert loaded["b", "dirty-tombstone"].data is None
    assert loaded["b", "dirty-tombstone"].obj is None


# -- memory-mode staging ------------------------------------------------------------------------


async def test_staged_write_reaches_disk_without_anyone_waiting(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = await open_cache(path, memory_window=0.05)
    try:
        cache.stage(("o", "k"), make_entry(1, 1))
        # nobody awaits a commit: the writer commits on its own within the window; poll the
        # file for up to ~5 s (a bound for a stalled machine, not a latency assertion)
        rows: dict[StateKey, DiskRow] = {}
        for _ in range(500):
            rows = read_rows(path)
            if rows:
                break
            await asyncio.sleep(0.01)
        assert rows == {("o", "k"): ("1", 1, 0)}
        # the file shows a commit as soon as SQLite's thread made it, before the writer task
        # has resumed to count it: wait for the commit in flight to finish
        await cache.sync_now()
        assert cache.commits == 1
        assert cache.staged_count == 0
    finally:
        await cache.close()


async def test_sync_now_commits_staged_writes_before_the_window(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = await open_cache(path, memory_window=60.0)
    try:
        await cache.sync_now()  # nothing staged: returns at once, commits nothing
        assert cache.commits == 0
        for i in range(10):
            cache.stage(("o", f"k{i}"), make_entry(i, 1))
        await asyncio.sleep(0.1)
        # within the 60 s window the writer is still gathering: nothing on disk yet
        assert read_rows(path) == {}
        assert cache.staged_count == 10
        await asyncio.wait_for(cache.sync_now(), 10)
        assert read_rows(path) == {("o", f"k{i}"): (encode(i), 1, 0) for i in range(10)}
        assert cache.commits == 1
        assert cache.staged_count == 0
    finally:
        await cache.close()


async def test_close_commits_what_is_staged(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    cache = await open_cache(path, memory_window=60.0)
    cache.stage(("o", "k"), make_entry("last", 9))
    await asyncio.wait_for(cache.close(), 10)
    assert read_rows(path) == {("o", "k"): ('"last"', 9, 0)}


# -- locking ------------------------------------------------------------------------------------


async def test_second_cache_in_same_process_is_locked_out(tmp_path: Path) -> None:
    path = tmp_path / "cache.db"
    first = await open_cache(path)
    try:
        with pytest.raises(CacheLocked) as info:
            await LocalCache.open(path, owner_id="intruder")
        message = str(info.value)
        assert str(path) in message
        assert f"pid {os.getpid()}" in message
        assert repr(OWNER_ID) in message
        # the refused open did not disturb the holder
        await first.commit(("o", "k"), make_entry(1, 1))
        assert read_rows(path) == {("o", "k"): ("1", 1, 0)}
    finally:
        await first.close()
    second = await LocalCache.open(path, owner_id="next")
    try:
        assert set(await second.load()) == {("o", "k")}
    finally:
        await second.close()


@contextlib.contextmanager
def umask(mask: int) -> Any:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


async def test_the_cache_folder_and_its_files_are_the_users_only(tmp_path: Path) -> None:
    """Made here: the folder 0700, the cache file, its WAL, its shared memory and its lock
    0600, under the usual umask 022 (SQLite would make its files 0644, Python's mkdir 0755);
    a folder that exists keeps the mode its owner gave it."""
    folder = tmp_path / "volume" / "localstate-cache"
    with umask(0o022):
        cache = await open_cache(folder / "airflow-triggerer-0.db")
        try:
            await cache.commit(("o", "k"), make_entry(1, 1))
            names = sorted(p.name for p in folder.iterdir())
            assert names == ["airflow-triggerer-0.db", "airflow-triggerer-0.db-shm",
                             "airflow-triggerer-0.db-wal", "airflow-triggerer-0.db.lock"]
            assert {n: oct(os.stat(folder / n).st_mode & 0o777) for n in names} == dict.fromkeys(
                names, oct(0o600))
            assert oct(os.stat(folder).st_mode & 0o777) == oct(0o700)
        finally:
            await cache.close()
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o750)
        cache = await open_cache(shared / "t.db")
        await cache.close()
        assert oct(os.stat(shared).st_mode & 0o777) == oct(0o750)
        assert oct(os.stat(shared / "t.db").st_mode & 0o777) == oct(0o600)
