"""`LocalCache`: the triggerer's own SQLite file, written by one group-committing writer task.

The file itself (schema, pragmas, migration, errors) is `localstate._cache.cache_file`.
A row is dirty (the sync worker still owes it to the central DB) while
``version != synced_version``. Every write goes through one writer task: callers stage entries,
the writer turns all the entries staged while the previous commit ran into one transaction
(group commit), and each caller that asked for ``local`` durability waits for the commit that
carried its write. A ``memory`` write only asks the writer to commit within `memory_window`.
The writer reads each entry as it stands when the batch is taken, so a later write can never be
overwritten by an older one.

The same commits carry the outbox (`localstate._cache.outbox`): events staged with `stage_event`
before the watermark entry they go with commit in the same transaction as it, or an earlier
one; `drop_events` removes the ones the central DB has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Final, Literal

import aiosqlite

from localstate._cache.cache_compaction import Compactor, file_bytes
from localstate._cache.cache_file import (
    UPSERT,
    connect,
    create_private,
    file_in_the_way,
    fsync_folder,
    make_folder,
    mark_closed,
    prepare,
    take_closed_mark,
    wrap_errors,
)
from localstate._cache.entry import NOT_DECODED, Entry, StateKey
from localstate._cache.left_open import track_open, untrack
from localstate._core.codec import IMMUTABLE_TYPES, decode
from localstate._core.file_lock import CacheFileLock
from localstate._core.rows import EventRow
from localstate.errors import CacheError, CachePathNotWritable, CacheWriteFailed

__all__ = ["LocalCache", "LocalSync"]

log = logging.getLogger("localstate.local_cache")

LocalSync = Literal["full", "normal"]
_PURGE: Final = "DELETE FROM state WHERE owner = ? AND key = ?"
_OUTBOX_ADD: Final = "INSERT OR REPLACE INTO outbox VALUES (?, ?, ?, ?, ?)"
_OUTBOX_DROP: Final = "DELETE FROM outbox WHERE seq = ?"
# Back off this long after a failed commit before retrying the staged batch (disk full, I/O).
_RETRY_DELAY: Final = 0.1
# At interpreter exit, the longest the last commit and close of a cache left open may take.
_EXIT_TIMEOUT: Final = 10.0


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
        lock: CacheFileLock | None = None,
        new_writer_id: str | None = None,
    ) -> None:
        self.path = path
        self._new_writer_id = new_writer_id
        self.local_sync = local_sync
        self.memory_window = memory_window
        #: the file's lock: taken at open, or handed over already held (`lock`)
        self.lock = lock if lock is not None else CacheFileLock(path, owner_id=owner_id)
        self._lock = self.lock
        self._conn: aiosqlite.Connection | None = None
        self._staged: dict[StateKey, Entry] = {}
        # outbox changes for the next commit: events to add, seqs to drop (flushed)
        self._staged_events: list[EventRow] = []
        self._dropped_events: list[int] = []
        self._batch: _Batch | None = None  # the next commit, once somebody waits for it
        self._inflight: _Batch | None = None  # the commit running now
        self._pending = asyncio.Event()  # something is staged
        self._urgent = asyncio.Event()  # somebody waits for the commit
        self._stopping = False
        self._writer: asyncio.Task[None] | None = None
        self._closed = False
        self._writer_id: str | None = None
        #: whether the file's last process closed it cleanly (its ``closed`` mark, see
        #: `localstate._cache.cache_file`): if not, the central DB may hold writes of this
        #: file's chain its clean rows lack, which the sync worker checks for
        self.closed_cleanly = False
        #: gives free pages back to the filesystem (see `localstate._cache.cache_compaction`)
        self.compactor = Compactor(path)
        # figures for stats()
        self.commits = 0
        self.rows_committed = 0
        #: (monotonic end, seconds) of the recent successful commits, timed on the event loop
        #: from taking the staged batch to waking its waiters: what a ``local`` write waits for,
        #: loop turns included (each statement is a round trip to aiosqlite's thread)
        self.recent_commits: deque[tuple[float, float]] = deque(maxlen=10_000)
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
        lock: CacheFileLock | None = None,
        new_writer_id: str | None = None,
    ) -> LocalCache:
        """Open (or create) the cache file at `path`; `lock`: its lock, already held by the
        caller (a store that kept it while its cache was off), taken over by this cache;
        `new_writer_id`: the writer id a file created now gets (see `prepare`)."""
        cache = cls(path, owner_id=owner_id, local_sync=local_sync, memory_window=memory_window,
                    lock=lock, new_writer_id=new_writer_id)
        await cache._open()  # an instance of this class, not yet returned to anyone
        return cache

    async def _open(self) -> None:
        try:
            await asyncio.to_thread(make_folder, self.path.parent)
        except OSError as exc:
            blocker = file_in_the_way(self.path.parent)
            why = exc.strerror if blocker is None else f"{blocker} is a file, not a folder"
            raise CachePathNotWritable(
                f"cannot create the cache folder {self.path.parent} for the local cache "
                f"{self.path}: {why}; set cache_dir (or cache_path) to a writable folder",
                path=str(self.path),
            ) from exc
        self._lock.acquire()
        try:
            new_file = not self.path.exists()
            if new_file:
                try:
                    await asyncio.to_thread(create_private, self.path)
                except OSError as exc:
                    raise CachePathNotWritable(
                        f"cannot create the local cache {self.path}: {exc.strerror}; make "
                        "its folder writable, or set cache_dir (or cache_path) to a "
                        "writable folder", path=str(self.path)) from exc
            self._conn = await connect(self.path)
            self._writer_id = await prepare(self._conn, self.path, self.local_sync,
                                            self._new_writer_id)
            self.closed_cleanly = await take_closed_mark(self._conn, self.path)
            if new_file:
                # The file's name is durable only once its folder is fsynced. SQLite does that
                # when it first syncs a new journal or WAL, unless built without it
                # (SQLITE_DISABLE_DIRSYNC): do it here, once, whatever the build.
                try:
                    await asyncio.to_thread(fsync_folder, self.path.parent)
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
        track_open(self)  # closed at interpreter exit if the program never closes it

    async def _abort_open(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
        self._lock.release()
        self._closed = True

    async def close(self, *, keep_lock: bool = False) -> None:
        """Commit what is staged, stop the writer and close the file. Safe to call twice.

        `keep_lock`: the file's lock (`lock`) stays held, for the caller to release or hand
        to the next open: no other process can take the file, and with it this file's writer
        id, meanwhile."""
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
            await self._mark_closed_if_complete()
            await self._conn.close()
            self._conn = None
        if not keep_lock:
            self._lock.release()
        untrack(self)

    def close_at_exit(self) -> None:
        """The interpreter exits with this cache still open (`localstate._cache.left_open`): end
        its writer, which commits what is staged, closes the file and warns. On its own
        loop when that still runs on another thread, else on a loop made for it here."""
        writer = self._writer
        if self._closed or writer is None:
            return
        loop = writer.get_loop()
        try:
            if loop.is_running():  # on another thread: this one is exiting
                asyncio.run_coroutine_threadsafe(_end(writer), loop).result(_EXIT_TIMEOUT)
                return
            # its loop is stopped (closed, as often): the writer will never run again
            with contextlib.closing(asyncio.new_event_loop()) as own:
                own.run_until_complete(asyncio.wait_for(self._close_abandoned(), _EXIT_TIMEOUT))
        except Warning:
            raise  # the ResourceWarning, under an "error" filter: the cache is closed
        except Exception as exc:  # at exit: report, never raise
            log.warning("the local cache %s could not be closed at exit (%s); it opens as "
                        "after a crash: only the last memory window's writes may be lost",
                        self.path, exc)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def file_bytes(self) -> int:
        """The bytes the file and its WAL take on disk now."""
        return file_bytes(self.path)

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
        with wrap_errors(self.path, "read"):
            async with conn.execute(
                "SELECT owner, key, value, version, updated_at, updated_by, synced_version "
                "FROM state"
            ) as cursor:
                async for owner, key, value, version, updated_at, updated_by, synced in cursor:
                    entries[owner, key] = Entry(
                        value, _immutable(value), version, updated_at, updated_by, synced
                    )
        return entries

    async def load_outbox(self) -> list[EventRow]:
        """The events of the outbox, in emit order (those the central DB does not hold yet)."""
        conn = self._require()
        with wrap_errors(self.path, "read"):
            async with conn.execute(
                "SELECT seq, owner, key, payload, created_at FROM outbox ORDER BY seq"
            ) as cursor:
                return [EventRow(int(s), o, k, p, float(t)) async for s, o, k, p, t in cursor]

    # -- writing ---------------------------------------------------------------------------

    def stage_event(self, event: EventRow) -> None:
        """Have the next commit add `event` to the outbox. Staged before the watermark entry it
        goes with, it commits in the same transaction or an earlier one: never after it."""
        self._staged_events.append(event)
        if not self._pending.is_set():
            self._pending.set()

    def drop_events(self, seqs: list[int]) -> None:
        """Have the next commit remove these events from the outbox (the central DB has them)."""
        if seqs:
            self._dropped_events.extend(seqs)
            if not self._pending.is_set():
                self._pending.set()

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
        if self._staged or self._staged_events or self._dropped_events:
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
        try:
            await self._write_until_stopped()
        except asyncio.CancelledError:
            # Nothing but the end of the event loop cancels the writer (`asyncio.run` cancels
            # every task left when its main coroutine returns or raises): the store was never
            # closed. Commit what is staged and close the file, so that nothing acknowledged
            # is lost and no SQLite thread outlives the loop.
            await self._close_abandoned()
            raise

    async def _write_until_stopped(self) -> None:
        while True:
            await self._pending.wait()
            if not self._urgent.is_set():
                # only memory writes: let more arrive, up to the promised window
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), self.memory_window)
            self._pending.clear()
            self._urgent.clear()
            staged, self._staged = self._staged, {}
            events, self._staged_events = self._staged_events, []
            dropped, self._dropped_events = self._dropped_events, []
            # every commit gets a batch, waited on or not, so that sync_now() can wait for the
            # one in flight too
            batch = self._batch or _Batch()
            self._batch = None
            self._inflight = batch
            started = time.monotonic()
            busy = bool(staged or events or dropped)
            try:
                error = await self._commit_batch(staged, events, dropped) if busy else None
            except asyncio.CancelledError:
                # the loop ends mid-commit: `_close_abandoned` commits the batch again (it
                # holds its waiters' writes whether or not this commit went through)
                self._restage(staged, events, dropped)
                raise
            self._inflight = None
            if busy and error is None:
                ended = time.monotonic()
                self.recent_commits.append((ended, ended - started))
            batch.error = error
            batch.done.set()
            if error is not None:
                # keep what failed, under anything staged since, and try again shortly
                self._restage(staged, events, dropped)
                self._pending.set()
                if not self._stopping:
                    await asyncio.sleep(_RETRY_DELAY)
            if self._stopping and (not (self._staged or self._staged_events
                                        or self._dropped_events) or error is not None):
                return

    def _restage(self, staged: dict[StateKey, Entry], events: list[EventRow],
                 dropped: list[int]) -> None:
        """Put a batch taken for a commit that did not happen back, under anything staged
        since (a later write of a key wins)."""
        for key, entry in staged.items():
            self._staged.setdefault(key, entry)
        self._staged_events[:0] = events
        self._dropped_events[:0] = dropped

    async def _close_abandoned(self) -> None:
        """The event loop ends with this cache open: commit what is staged, close the file
        and release its lock, then say so (a `ResourceWarning`, unless `close` had begun).

        The writes the central DB lacks stay dirty in the file, for the next open to flush.
        A commit that fails here leaves what it carried to the memory window's promise (as
        after a crash); the file itself is consistent either way."""
        never_closed = not self._closed
        self._closed = self._stopping = True
        error: BaseException | None = None
        try:
            if self._conn is not None:
                staged, self._staged = self._staged, {}
                events, self._staged_events = self._staged_events, []
                dropped, self._dropped_events = self._dropped_events, []
                if staged or events or dropped:
                    error = await self._commit_batch(staged, events, dropped)
                if error is None:
                    await self._mark_closed_if_complete()
                await self._conn.close()
        except Exception as exc:  # the loop is ending: report it, never raise
            error = exc
        finally:
            self._conn = None
            self._lock.release()
        for batch in (self._batch, self._inflight):
            if batch is not None and not batch.done.is_set():
                batch.error = error  # None: this commit carried their writes
                # at exit the event's loop may be closed: nobody is left to wake then
                with contextlib.suppress(RuntimeError):
                    batch.done.set()
        untrack(self)
        if error is not None:
            log.warning("the local cache %s could not commit its last writes as the event "
                        "loop ended (%s); those of the last memory window may be lost",
                        self.path, error)
        if never_closed:
            warnings.warn(
                f"the local cache {self.path} was never closed (its store was left open): its "
                "writes are committed to the file now, and the next store that opens the file "
                "flushes those the central DB lacks; close the store (`await store.close()`, "
                "`async with`, or `with` for a BlockingStateStore)", ResourceWarning,
                stacklevel=1)

    async def _mark_closed_if_complete(self) -> None:
        """Close cleanly: the ``closed`` mark, once the file holds everything staged (a last
        commit that failed leaves it out, and the next open checks the clean rows)."""
        if self._staged or self._staged_events or self._dropped_events or (
                self.last_error is not None):
            return
        try:
            await mark_closed(self._require(), self.path)
        except CacheError as exc:
            log.warning("%s; the next open of the file checks its rows against the central "
                        "DB", exc)

    async def _commit_batch(self, staged: dict[StateKey, Entry], events: list[EventRow],
                            dropped: list[int]) -> CacheError | None:
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
            with wrap_errors(self.path, "commit"):
                try:
                    if upserts:
                        await conn.executemany(UPSERT, upserts)
                    if purges:
                        await conn.executemany(_PURGE, purges)
                    if events:
                        await conn.executemany(_OUTBOX_ADD, [e[:5] for e in events])
                    if dropped:
                        await conn.executemany(_OUTBOX_DROP, [(s,) for s in dropped])
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
        if purges:
            await self.compactor.after_purges(conn, len(purges))
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


async def _end(writer: asyncio.Task[None]) -> None:
    """Cancel `writer` (it closes its cache as the loop's end would) and wait for it."""
    writer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await writer


def _immutable(data: str | None) -> Any:
    """The decoded value when handing it out as is is safe, else NOT_DECODED."""
    if data is None:
        return None
    value = decode(data)
    return value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
