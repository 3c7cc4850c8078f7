"""Cache files a store cannot use, each refused clearly and left as it was.

Garbage, a truncated file, another program's SQLite database, a newer schema, a read-only
folder (a read-only bind mount as root, who ignores permission bits; ``chmod`` otherwise), a
path of the wrong type, a file held by a live process (a real subprocess): each open raises a
typed error naming the file and the way out, twice in a row, and leaves every byte in the
folder as it was; then the way out the message gives is taken, and the cache opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from disks import CAN_MOUNT, ReadOnlyFolder, files_under, sha256
from fault_tally import FaultTally

from localstate import (
    CacheCorrupt,
    CacheError,
    CacheLocked,
    CachePathNotWritable,
    LocalStateError,
    SchemaError,
    StateStore,
)
from localstate._cache.cache_file import SCHEMA_VERSION
from localstate._core.file_lock import CacheFileLock

OWNER = "asset_watcher:files"


async def cache_with_rows(path: Path, rows: int) -> None:
    """A real cache file holding `rows` values, closed (its WAL checkpointed into the file)."""
    store = await StateStore.open(cache_path=path, central_url=f"sqlite:///{path}.central",
                                  triggerer_id="maker", flush_interval=60)
    try:
        await asyncio.gather(*(store.set(OWNER, f"k{i}", "x" * 200 + str(i))
                               for i in range(rows)))
    finally:
        await store.close()


_HOLDER = """
import asyncio, pathlib, sys
from localstate import StateStore

async def main():
    path = pathlib.Path(sys.argv[1])
    store = await StateStore.open(cache_path=path, central_url=f"sqlite:///{path}.central",
                                  triggerer_id="holder-process", flush_interval=3600)
    print("READY", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@dataclass
class BadFile:
    """A cache path prepared to fail, what the error must say, and the way out to take."""

    path: Path
    #: take the way out the message names; afterwards the cache opens
    way_out: Callable[[], Awaitable[None]] | None = None
    #: the rows the cache holds once the way out is taken
    rows_after: int = 0
    #: the text the message must also hold (a pid, say)
    also: list[str] = field(default_factory=list)


Maker = Callable[[Path, contextlib.AsyncExitStack], Awaitable[BadFile]]


def _rename_aside(path: Path) -> None:
    before = sha256(path)
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    assert sha256(aside) == before  # the file is kept whole, for whoever wants to look


def move_aside(path: Path) -> Callable[[], Awaitable[None]]:
    async def go() -> None:
        _rename_aside(path)
    return go


async def _garbage(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    path.write_bytes(random.Random(1234).randbytes(64 * 1024))
    return BadFile(path, move_aside(path))


async def _truncated(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    await cache_with_rows(path, 300)
    data = path.read_bytes()
    assert len(data) > 16 * 4096  # many pages, so the cut loses real b-tree pages
    path.write_bytes(data[: int(len(data) * 0.6)])
    return BadFile(path, move_aside(path))


async def _foreign(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE foo (x INTEGER)")
        conn.execute("INSERT INTO foo VALUES (1)")
        conn.commit()
    return BadFile(path, move_aside(path))


async def _foreign_application_id(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA application_id=305419896")  # another program's id, no tables
        conn.execute("PRAGMA user_version=1")
    return BadFile(path, move_aside(path))


async def _newer_schema(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    await cache_with_rows(path, 20)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    return BadFile(path, move_aside(path))


async def _read_only_folder(folder: Path, stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    await cache_with_rows(path, 20)
    read_only = ReadOnlyFolder(folder)
    read_only.make_read_only()
    stack.callback(read_only.make_writable)

    async def make_writable() -> None:
        read_only.make_writable()

    return BadFile(path, make_writable, rows_after=20)


async def _held_by_live_process(folder: Path, stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    await cache_with_rows(path, 20)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLDER, str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )

    async def kill() -> None:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.communicate()

    stack.push_async_callback(kill)
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line == b"READY\n", line

    async def stop_the_holder() -> None:
        await kill()
        assert proc.returncode == -signal.SIGKILL

    return BadFile(path, stop_the_holder, rows_after=20,
                   also=[f"pid {proc.pid}", "'holder-process'"])


# Each of these fails on the *type* of a file (ENOTDIR, EISDIR), which the kernel refuses to
# root and to everyone else alike.
async def _parent_is_a_file(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    blocker = folder / "afile"
    blocker.write_bytes(b"a regular file, not a folder")
    return BadFile(blocker / "cache.db")


async def _parent_of_parent_is_a_file(folder: Path, _stack: contextlib.AsyncExitStack
                                      ) -> BadFile:
    blocker = folder / "afile"
    blocker.write_bytes(b"a regular file, not a folder")
    return BadFile(blocker / "sub" / "cache.db")


async def _cache_is_a_folder(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    path.mkdir()
    (path / "keep").write_bytes(b"inside")
    return BadFile(path)


async def _lock_is_a_folder(folder: Path, _stack: contextlib.AsyncExitStack) -> BadFile:
    path = folder / "cache.db"
    await cache_with_rows(path, 5)
    lock = path.with_name(path.name + ".lock")
    lock.unlink()
    lock.mkdir()
    return BadFile(path)


MOVE_ASIDE = "move it aside"
WRITABLE = "set cache_dir"
BAD_FILES: dict[str, tuple[Maker, type[LocalStateError], str, str]] = {
    # case: (make it, the error, what the message says is wrong, the way out it gives)
    "garbage": (_garbage, CacheCorrupt, "not a database", MOVE_ASIDE),
    "truncated": (_truncated, CacheCorrupt, "malformed", MOVE_ASIDE),
    "foreign-sqlite-db": (_foreign, CacheCorrupt, "not a localstate cache",
                          "point cache_path at another file"),
    "foreign-application-id": (_foreign_application_id, CacheCorrupt,
                               "not a localstate cache", "point cache_path at another file"),
    "newer-schema": (_newer_schema, SchemaError, f"schema version {SCHEMA_VERSION + 1}",
                     "upgrade localstate, or move the file aside"),
    "read-only-folder": (_read_only_folder, CachePathNotWritable,
                         # root: EROFS from the bind mount; otherwise the lock file or
                         # SQLite's -wal file cannot be created, which both messages open with
                         "Read-only file system" if CAN_MOUNT else "cannot",
                         WRITABLE),
    "held-by-live-process": (_held_by_live_process, CacheLocked,
                             "in use by another live process", "stop that process"),
    "parent-is-a-file": (_parent_is_a_file, CachePathNotWritable,
                         "afile is a file, not a folder", WRITABLE),
    "parent-of-parent-is-a-file": (_parent_of_parent_is_a_file, CachePathNotWritable,
                                   "afile is a file, not a folder", WRITABLE),
    "cache-path-is-a-folder": (_cache_is_a_folder, CachePathNotWritable, "unable to open",
                               WRITABLE),
    "lock-path-is-a-folder": (_lock_is_a_folder, CachePathNotWritable, "Is a directory",
                              WRITABLE),
}


@pytest_asyncio.fixture
async def exit_stack() -> AsyncIterator[contextlib.AsyncExitStack]:
    async with contextlib.AsyncExitStack() as stack:
        yield stack


async def open_at(path: Path, central: str) -> StateStore:
    return await StateStore.open(cache_path=path, central_url=central, triggerer_id="victim",
                                 flush_interval=60)


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
async def test_unusable_cache_file_is_refused_clearly_and_left_untouched(
    tmp_path: Path, kind: str, exit_stack: contextlib.AsyncExitStack, fault_tally: FaultTally
) -> None:
    """The central DB plays no part here: an embedded SQLite one, outside the faulty folder."""
    make, error, problem, way_out = BAD_FILES[kind]
    folder = tmp_path / "caches"
    folder.mkdir()
    central = f"sqlite:///{tmp_path / 'central.db'}"
    bad = await make(folder, exit_stack)
    before = files_under(folder)
    for attempt in range(2):  # and the refusal is stable: a second attempt says the same
        with pytest.raises(error) as info:
            await open_at(bad.path, central)
        message = str(info.value)
        for text in (str(bad.path), problem, way_out, *bad.also):
            assert text in message, f"{text!r} not in: {message}"
        if isinstance(info.value, CacheError):
            assert info.value.path == str(bad.path)
        after = files_under(folder)
        # nothing wiped or rewritten (a lock file beside the cache may be created: the lock's)
        changed = [p for p in before if after.get(p) != before[p]]
        fault_tally.add("file faults checked")
        fault_tally.lost("cache files (refused opens)", len(changed))
        assert changed == [], f"attempt {attempt}: modified or removed: {changed}"
    if kind != "held-by-live-process" and bad.path.parent.is_dir():
        # the failed open let go of its lock, so nobody holds the file now
        lock = CacheFileLock(bad.path, owner_id="probe")
        with contextlib.suppress(CachePathNotWritable):  # a read-only or odd folder
            lock.acquire()
        lock.release()
    if bad.way_out is not None:
        await bad.way_out()
        store = await open_at(bad.path, central)
        try:
            assert len([r async for r in store.items(OWNER)]) == bad.rows_after
            await store.set(OWNER, "after-the-way-out", 1)
        finally:
            await store.close()


async def test_a_dead_holder_does_not_lock_the_cache(tmp_path: Path) -> None:
    """The kernel drops a SIGKILLed holder's flock: the next process takes the cache over."""
    folder = tmp_path / "caches"
    folder.mkdir()
    async with contextlib.AsyncExitStack() as stack:
        bad = await _held_by_live_process(folder, stack)
        assert bad.way_out is not None
        await bad.way_out()  # SIGKILL, no cleanup in the holder
    central = f"sqlite:///{tmp_path / 'central.db'}"
    store = await open_at(bad.path, central)
    try:
        with pytest.raises(CacheLocked, match=f"pid {os.getpid()}"):
            await open_at(bad.path, central)  # the lock file now names us
        assert await store.get(OWNER, "k0") == "x" * 200 + "0"
    finally:
        await store.close()
