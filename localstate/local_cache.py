"""`LocalCache`: the triggerer's own SQLite file, written by one group-committing writer task.

Schema (``PRAGMA user_version`` = `SCHEMA_VERSION`, ``PRAGMA application_id`` = `APPLICATION_ID`)::

    CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
        -- 'writer_id': a random id given to the file when it is created (see `writer_id`)

    CREATE TABLE state (
        owner          TEXT    NOT NULL,
        key            TEXT    NOT NULL,
        value          TEXT,              -- JSON text; NULL: deleted, not yet flushed
        version        INTEGER NOT NULL,  -- one more with every write
        updated_at     REAL    NOT NULL,  -- POSIX seconds
        updated_by     TEXT    NOT NULL,  -- the writer's id (the triggerer id)
        synced_version INTEGER NOT NULL,  -- the version the central DB is known to hold (0: none)
        PRIMARY KEY (owner, key)
    ) WITHOUT ROWID;

A row is dirty (the sync worker still owes it to the central DB) while
``version != synced_version``. Every write goes through one writer task: callers stage entries,
the writer turns all the entries staged while the previous commit ran into one transaction
(group commit), and each caller that asked for ``local`` durability waits for the commit that
carried its write. A ``memory`` write only asks the writer to commit within `memory_window`.
The writer reads each entry as it stands when the batch is taken, so a later write can never be
overwritten by an older one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

import aiosqlite

from localstate.codec import IMMUTABLE_TYPES, decode
from localstate.entry import NOT_DECODED, Entry, StateKey
from localstate.errors import (
    CacheCorrupt,
    CacheError,
    CacheFull,
    CachePathNotWritable,
    CacheWriteFailed,
    SchemaError,
)
from localstate.file_lock import CacheFileLock

__all__ = ["APPLICATION_ID", "SCHEMA", "SCHEMA_VERSION", "UPSERT", "LocalCache", "LocalSync"]

log = logging.getLogger(__name__)

#: "LSt1": marks a SQLite file as a localstate cache, so a stranger's database is never touched.
APPLICATION_ID: Final = 0x4C537431
SCHEMA_VERSION: Final = 2

LocalSync = Literal["full", "normal"]

SCHEMA: Final = """
CREATE TABLE state (
    owner          TEXT    NOT NULL,
    key            TEXT    NOT NULL,
    value          TEXT,
    version        INTEGER NOT NULL,
    updated_at     REAL    NOT NULL,
    updated_by     TEXT    NOT NULL,
    synced_version INTEGER NOT NULL,
    PRIMARY KEY (owner, key)
) WITHOUT ROWID
"""
#: version 2 adds it: one row, the file's writer id
_META: Final = "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
UPSERT: Final = "INSERT OR REPLACE INTO state VALUES (?, ?, ?, ?, ?, ?, ?)"
_PURGE: Final = "DELETE FROM state WHERE owner = ? AND key = ?"
# The way on after a failed commit, for the messages of CacheWriteFailed and CacheFull.
_KEPT: Final = (
    "Writes not yet committed are kept in memory and retried every 0.1 s; a set that raised "
    "this is not acknowledged until a retry commits it"
)
# Below this many free bytes a filesystem counts as full (an I/O error there is ENOSPC).
_NEARLY_FULL: Final = 64 * 1024
# Back off this long after a failed commit before retrying the staged batch (disk full, I/O).
_RETRY_DELAY: Final = 0.1


class _Batch:
    """The commit that the writes staged now will ride on; waiters wait on `done`."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.error: BaseException | None = None


class LocalCache:
    """The local SQLite write-ahead cache of one process. Open with `await LocalCache.open()`."""

    def __init__(
        self,
        path: Path,
        *,
        owner_id: str,
        local_sync: LocalSync = "full",
        memory_window: float = 0.05,
    ) -> None:
        self.path = path
        self.local_sync = local_sync
        self.memory_window = memory_window
        self._lock = CacheFileLock(path, owner_id=owner_id)
        self._conn: aiosqlite.Connection | None = None
        self._staged: dict[StateKey, Entry] = {}
        self._batch: _Batch | None = None  # the next commit, once somebody waits for it
        self._inflight: _Batch | None = None  # the commit running now
        self._pending = asyncio.Event()  # something is staged
        self._urgent = asyncio.Event()  # somebody waits for the commit
        self._stopping = False
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._writer_id: str | None = None
        # figures for stats()
        self.commits = 0
        self.rows_committed = 0
        self.last_error: BaseException | None = None

    # -- opening and closing ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        owner_id: str,
        local_sync: LocalSync = "full",
        memory_window: float = 0.05,
    ) -> LocalCache:
        cache = cls(path, owner_id=owner_id, local_sync=local_sync, memory_window=memory_window)
        await cache._open()  # an instance of this class, not yet returned to anyone
        return cache

    async def _open(self) -> None:
        try:
            await asyncio.to_thread(_make_folder, self.path.parent)
        except OSError as exc:
            blocker = _file_in_the_way(self.path.parent)
            why = exc.strerror if blocker is None else f"{blocker} is a file, not a folder"
            raise CachePathNotWritable(
                f"cannot create the cache folder {self.path.parent} for the local cache "
                f"{self.path}: {why}; set cache_dir (or cache_path) to a writable folder",
                path=str(self.path),
            ) from exc
        self._lock.acquire()
        try:
            new_file = not self.path.exists()
            self._conn = await self._connect()
            await self._check_and_prepare(self._conn)
            if new_file:
                # The file's name is durable only once its folder is fsynced. SQLite does that
                # when it first syncs a new journal or WAL, unless built without it
                # (SQLITE_DISABLE_DIRSYNC): do it here, once, whatever the build.
                try:
                    await asyncio.to_thread(_fsync_folder, self.path.parent)
                except OSError as exc:
                    raise CacheWriteFailed(
                        f"cannot fsync the folder of the new local cache {self.path}: "
                        f"{exc.strerror}; set cache_dir to a folder on a healthy local disk",
                        path=str(self.path),
                    ) from exc
        except BaseException:
            await self._abort_open()
            raise
        self._writer = asyncio.get_running_loop().create_task(
            self._write_loop(), name=f"localstate-writer:{self.path.name}"
        )

    async def _connect(self) -> aiosqlite.Connection:
        connection = aiosqlite.connect(self.path)
        try:
            # wrapped: a cache path SQLite cannot open (a folder, say) must raise our error
            # naming the file, not a bare sqlite3.OperationalError
            with self._wrap("open"):
                return await connection
        except BaseException:
            # After a failed connect aiosqlite stops its worker thread without waiting for it;
            # the thread then calls into the event loop, which may be closed by then
            # ("RuntimeError: Event loop is closed" in that thread). Wait for it here.
            thread = getattr(connection, "_thread", None)
            if thread is not None and thread.is_alive():
                await asyncio.to_thread(thread.join, 10)
            raise

    async def _abort_open(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
        self._lock.release()
        self._closed = True

    async def _check_and_prepare(self, conn: aiosqlite.Connection) -> None:
        """Refuse any file that is not ours, then set the pragmas. Never wipes anything."""
        with self._wrap("open"):
            app_id = await self._scalar(conn, "PRAGMA application_id")
            user_version = await self._scalar(conn, "PRAGMA user_version")
            tables = await self._scalar(conn, "SELECT count(*) FROM sqlite_master")
        if app_id != APPLICATION_ID and (app_id != 0 or tables != 0):
            raise CacheCorrupt(
                f"{self.path} is a SQLite database but not a localstate cache "
                f"(application_id {app_id:#x}); point cache_path at another file, "
                "this one was left untouched",
                path=str(self.path),
            )
        if app_id == APPLICATION_ID and user_version > SCHEMA_VERSION:
            raise SchemaError(
                f"the local cache {self.path} has schema version {user_version}, newer than "
                f"this localstate ({SCHEMA_VERSION}); upgrade localstate, or move the file "
                "aside to start an empty cache (its unflushed writes stay in it)"
            )
        with self._wrap("open"):
            quick = await self._scalar(conn, "PRAGMA quick_check(1)")
            if quick != "ok":
                raise CacheCorrupt(
                    f"the local cache {self.path} failed SQLite's quick_check ({quick}); "
                    "move it aside (what it has flushed is safe in the central DB) and restart",
                    path=str(self.path),
                )
            # WAL: a commit appends to the -wal file instead of rewriting pages, readers (the
            # CLI, a backup) never block the writer, and a commit needs one fsync, not two.
            mode = await self._scalar(conn, "PRAGMA journal_mode=WAL")
            if str(mode).lower() != "wal":
                raise CachePathNotWritable(
                    f"{self.path} cannot use WAL mode (got {mode!r}); keep the cache on a "
                    "local filesystem",
                    path=str(self.path),
                )
            # FULL: every commit is fsynced, so a write acknowledged in `local` durability
            # survives power loss as well as a crash. Group commit spreads that one fsync over
            # every write staged meanwhile. NORMAL (an option) survives a process crash but
            # may lose the last commits on power loss.
            await conn.execute(f"PRAGMA synchronous={self.local_sync.upper()}")
            # A CLI reader or a backup may hold a read lock for a moment: wait, don't fail.
            await conn.execute("PRAGMA busy_timeout=5000")
            # Keep the -wal file from growing past 8 MiB after checkpoints (a soak stays flat).
            await conn.execute("PRAGMA journal_size_limit=8388608")
            await conn.execute("PRAGMA temp_store=MEMORY")
            if app_id == 0 or user_version < SCHEMA_VERSION:
                # One transaction: sqlite3 runs DDL in autocommit, so without the BEGIN a
                # crash right after CREATE TABLE left a file with a table and application_id
                # 0, which every later open refused as "not a localstate cache".
                await conn.execute("BEGIN IMMEDIATE")
                if app_id == 0:
                    await conn.execute(SCHEMA)
                await conn.execute(_META)
                await conn.execute("INSERT INTO meta VALUES ('writer_id', ?)",
                                   (uuid.uuid4().hex,))
                await conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                await conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                await conn.commit()
            self._writer_id = str(
                await self._scalar(conn, "SELECT value FROM meta WHERE name = 'writer_id'"))

    @staticmethod
    async def _scalar(conn: aiosqlite.Connection, sql: str) -> Any:
        async with conn.execute(sql) as cursor:
            row = await cursor.fetchone()
        return None if row is None else row[0]

    @contextlib.contextmanager
    def _wrap(self, doing: str) -> Iterator[None]:
        """Turn sqlite3 errors into localstate's, naming the file and what to do."""
        try:
            yield
        except CacheError:
            raise
        except sqlite3.Error as exc:
            raise self._translate(exc, doing) from exc

    def _translate(self, exc: sqlite3.Error, doing: str) -> CacheError:
        text = str(exc)
        path = str(self.path)
        if isinstance(exc, sqlite3.DatabaseError) and (
            "not a database" in text or "malformed" in text
        ):
            return CacheCorrupt(
                f"the local cache {path} is damaged or not a database ({text}); move it aside "
                "(what it has flushed is safe in the central DB) and restart",
                path=path,
            )
        if "readonly" in text or "unable to open" in text:
            return CachePathNotWritable(
                f"cannot write the local cache {path} ({text}); make it and its folder "
                "writable, or set cache_dir to a writable folder",
                path=path,
            )
        # what became of the writes: only a failed commit has any in hand
        kept = f" {_KEPT}" if doing == "commit" else ""
        # SQLITE_FULL says "database or disk is full"; a full disk met while SQLite extends
        # its -shm file (an open, say) only says "disk I/O error": ask the filesystem
        if "disk is full" in text or ("disk I/O" in text and _no_space_left(self.path)):
            return CacheFull(
                f"the local cache {path} could not {doing}: the disk holding it is full "
                f"({text}); free space on that filesystem, or set cache_dir (or cache_path) to "
                f"a folder on another disk.{kept}",
                path=path,
            )
        if "disk I/O" in text:
            return CacheWriteFailed(
                f"the local cache {path} could not {doing}: {text}; check that disk (the "
                f"kernel log says why) or set cache_dir to a folder on a healthy local disk."
                f"{kept}",
                path=path,
            )
        return CacheWriteFailed(f"the local cache {path} could not {doing}: {text}.{kept}",
                                path=path)

    async def close(self) -> None:
        """Commit what is staged, stop the writer and close the file. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._stopping = True
        self._pending.set()
        self._urgent.set()
        if self._writer is not None:
            await self._writer
            self._writer = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._lock.release()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def writer_id(self) -> str:
        """The file's own id, made at random when the file was created and kept in it.

        The sync worker records it with every row it writes centrally. The file lock lets one
        process at a time use the file, so a central row carrying this id was written by
        this process or by an earlier one on this file that has ended: this file's own chain.
        """
        if self._writer_id is None:
            raise CacheError(f"the local cache {self.path} is not open", path=str(self.path))
        return self._writer_id

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if not self._closed and self._conn is not None:
            _warn(f"LocalCache {self.path} was never closed", ResourceWarning, stacklevel=1)

    # -- reading ---------------------------------------------------------------------------

    async def load(self) -> dict[StateKey, Entry]:
        """Every row of the file as entries (the store keeps them all in memory)."""
        conn = self._require()
        entries: dict[StateKey, Entry] = {}
        with self._wrap("read"):
            async with conn.execute(
                "SELECT owner, key, value, version, updated_at, updated_by, synced_version "
                "FROM state"
            ) as cursor:
                async for owner, key, value, version, updated_at, updated_by, synced in cursor:
                    entries[owner, key] = Entry(
                        value, _immutable(value), version, updated_at, updated_by, synced
                    )
        return entries

    # -- writing ---------------------------------------------------------------------------

    def stage(self, key: StateKey, entry: Entry) -> None:
        """Have the writer commit `entry` within `memory_window` (a `memory` write)."""
        self._staged[key] = entry
        if not self._pending.is_set():
            self._pending.set()

    def stage_many(self, entries: dict[StateKey, Entry]) -> None:
        """`stage` for many entries at once (a flush's mark-clean step)."""
        if entries:
            self._staged.update(entries)
            if not self._pending.is_set():
                self._pending.set()

    async def commit(self, key: StateKey, entry: Entry) -> None:
        """Stage `entry` and wait until the transaction that carries it has committed."""
        self._require_writer()
        self._staged[key] = entry
        await self._next_commit()

    async def sync_now(self) -> None:
        """Wait until everything staged or being committed now is committed."""
        if self._staged:
            self._require_writer()
            await self._next_commit()  # runs after the commit in flight, if any
            return
        inflight = self._inflight
        if inflight is not None:
            await inflight.done.wait()
            if inflight.error is not None:
                raise inflight.error

    async def _next_commit(self) -> None:
        """Wake the writer at once and wait for the commit of what is staged now."""
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
        self._pending.set()
        self._urgent.set()
        await batch.done.wait()
        if batch.error is not None:
            raise batch.error

    @property
    def staged_count(self) -> int:
        return len(self._staged)

    async def _write_loop(self) -> None:
        while True:
            await self._pending.wait()
            if not self._urgent.is_set():
                # only memory writes: let more arrive, up to the promised window
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self.memory_window)
            self._pending.clear()
            self._urgent.clear()
            staged, self._staged = self._staged, {}
            # every commit gets a batch, waited on or not, so that sync_now() can wait for the
            # one in flight too
            batch = self._batch or _Batch()
            self._batch = None
            self._inflight = batch
            error = await self._commit_batch(staged) if staged else None
            self._inflight = None
            batch.error = error
            batch.done.set()
            if error is not None:
                # keep what failed, under anything staged since, and try again shortly
                for key, entry in staged.items():
                    self._staged.setdefault(key, entry)
                self._pending.set()
                if not self._stopping:
                    await asyncio.sleep(_RETRY_DELAY)
            if self._stopping and (not self._staged or error is not None):
                return

    async def _commit_batch(self, staged: dict[StateKey, Entry]) -> CacheError | None:
        upserts: list[tuple[Any, ...]] = []
        purges: list[tuple[str, str]] = []
        for (owner, key), e in staged.items():
            if e.data is None and not e.dirty:
                purges.append((owner, key))  # a deletion the central DB has: drop the row
            else:
                upserts.append(
                    (owner, key, e.data, e.version, e.updated_at, e.updated_by, e.synced_version)
                )
        conn = self._require()
        try:
            with self._wrap("commit"):
                try:
                    if upserts:
                        await conn.executemany(UPSERT, upserts)
                    if purges:
                        await conn.executemany(_PURGE, purges)
                    await conn.commit()
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        await conn.rollback()
                    raise
        except CacheError as exc:
            # once per distinct failure: a full disk is retried every _RETRY_DELAY and would
            # log ten warnings a second until space returns
            if self.last_error is None or str(self.last_error) != str(exc):
                log.warning("%s", exc)
            self.last_error = exc
            return exc
        self.commits += 1
        self.rows_committed += len(staged)
        if self.last_error is not None:
            log.warning("the local cache %s commits again", self.path)
        self.last_error = None
        return None

    def _require_writer(self) -> None:
        # Once the writer task has ended (close()), nothing would ever set the batch's event:
        # waiting for it would hang forever, so refuse the wait instead.
        if self._writer is None or self._writer.done():
            raise CacheError(f"the local cache {self.path} is closed", path=str(self.path))

    def _require(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise CacheError(f"the local cache {self.path} is not open", path=str(self.path))
        return self._conn


def _make_folder(folder: Path) -> None:
    """``mkdir -p folder``, durably: a new folder's name is only durable once its parent is
    fsynced, and a power loss would take an unsynced folder, and the cache in it, away."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        _fsync_folder(created.parent)


def _fsync_folder(folder: Path) -> None:
    """fsync a folder, making the names in it durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        # a filesystem that cannot fsync a folder (EINVAL) has nothing more to offer: go on,
        # as SQLite does for its own folder syncs
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _file_in_the_way(folder: Path) -> Path | None:
    """The nearest existing ancestor of `folder` (itself included) when it is not a folder."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def _no_space_left(path: Path) -> bool:
    """Whether the filesystem holding `path` has (almost) no block left for it."""
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < _NEARLY_FULL


def _immutable(data: str | None) -> Any:
    """The decoded value when handing it out as is is safe, else NOT_DECODED."""
    if data is None:
        return None
    value = decode(data)
    return value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
