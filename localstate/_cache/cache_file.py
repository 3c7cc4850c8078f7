"""The local cache's file: its schema, pragmas and migration, and SQLite's errors translated.

Schema (``PRAGMA user_version`` = `SCHEMA_VERSION`, ``PRAGMA application_id`` = `APPLICATION_ID`)::

    CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
        -- 'writer_id': a random id given to the file when it is created (see `writer_id`)
        -- 'closed': present while no process has the file open, written by a clean close
        --   (`mark_closed`), taken away by the next open (`take_closed_mark`)

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

    CREATE TABLE outbox (                 -- events emitted, not yet committed centrally
        seq        INTEGER PRIMARY KEY,   -- emit order within this file
        owner      TEXT    NOT NULL,
        key        TEXT    NOT NULL,      -- the idempotency key
        payload    TEXT    NOT NULL,      -- JSON text
        created_at REAL    NOT NULL       -- POSIX seconds
    );

The ``closed`` mark. A flush does not wait for the local commit of what it carries, so a
process that dies between the two leaves the central DB ahead of the file: a key the file holds
clean at version 1 may be at version 2 centrally, a write of this file's chain that never
reached the file. Only a close that commits everything in memory, then writes the mark, rules
that out; a file opened without the mark (a crash, a kill, a release that kept none) has its
clean rows checked against the central DB by the sync worker (`SyncWorker.refresh_clean`).

`prepare` refuses a file that is not a localstate cache (`application_id`) or has a newer schema
(`user_version`), never wiping either; it creates or migrates the schema in one transaction.
`wrap_errors` turns an sqlite3 error into localstate's, naming the file and what to do.
`LocalCache` (`localstate._cache.local_cache`) owns the open connection and its writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import aiosqlite

from localstate._cache.cache_compaction import choose_incremental, convert_existing
from localstate.errors import (
    CacheCorrupt,
    CacheError,
    CacheFull,
    CachePathNotWritable,
    CacheWriteFailed,
    SchemaError,
)

__all__ = [
    "APPLICATION_ID",
    "KEPT",
    "OUTBOX",
    "PRIVATE_FILE",
    "PRIVATE_FOLDER",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UPSERT",
    "connect",
    "create_private",
    "file_in_the_way",
    "fsync_folder",
    "make_folder",
    "mark_closed",
    "prepare",
    "take_closed_mark",
    "translate",
    "worker_thread",
    "wrap_errors",
]

log = logging.getLogger("localstate.cache_file")

#: "LSt1": marks a SQLite file as a localstate cache, so a stranger's database is never touched.
APPLICATION_ID: Final = 0x4C537431
SCHEMA_VERSION: Final = 3
#: what each schema version added, for the one log line of a file's migration
_ADDED_BY: Final = ((2, "a writer id of its own"), (3, "an outbox for emitted events"))

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
#: version 3 adds it: events emitted with their watermark (`StateStore.emit`), until flushed
OUTBOX: Final = """
CREATE TABLE outbox (
    seq        INTEGER PRIMARY KEY,
    owner      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    payload    TEXT    NOT NULL,
    created_at REAL    NOT NULL
)
"""
#: version 2 adds it: one row, the file's writer id
META: Final = "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID"
UPSERT: Final = "INSERT OR REPLACE INTO state VALUES (?, ?, ?, ?, ?, ?, ?)"
# The way on after a failed commit, for the messages of CacheWriteFailed and CacheFull.
KEPT: Final = (
    "Writes not yet committed are kept in memory and retried every 0.1 s; a set that raised "
    "this is not acknowledged until a retry commits it"
)
# Below this many free bytes a filesystem counts as full (an I/O error there is ENOSPC).
NEARLY_FULL: Final = 64 * 1024
#: the modes of the cache folder localstate makes and of the files in it: the Airflow user's
#: only (the values the state holds are its business), less what the process's umask takes
PRIVATE_FOLDER: Final = 0o700
PRIVATE_FILE: Final = 0o600


async def connect(path: Path) -> aiosqlite.Connection:
    """Open `path` with aiosqlite; SQLite's refusal raises localstate's error naming it.

    The connection's worker thread is a daemon (as SQLAlchemy's aiosqlite dialect makes its
    own): a program that never closes its store (its code raised first, or it forgot) still
    exits. Closed, the thread ends as usual. Left open, the cache commits and closes the file
    when its event loop ends or the interpreter exits (`LocalCache`,
    `localstate._cache.left_open`); a process killed leaves the file as a crash would, which the
    file is made for."""
    connection = aiosqlite.connect(path)
    thread = worker_thread(connection)
    if thread is not None:
        thread.daemon = True  # before the await below starts it
    try:
        # wrapped: a cache path SQLite cannot open (a folder, say) must raise our error
        # naming the file, not a bare sqlite3.OperationalError
        with wrap_errors(path, "open"):
            return await connection
    except BaseException:
        # After a failed connect aiosqlite stops its worker thread without waiting for it;
        # the thread then calls into the event loop, which may be closed by then
        # ("RuntimeError: Event loop is closed" in that thread). Wait for it here.
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, 10)
        raise


def worker_thread(connection: aiosqlite.Connection) -> threading.Thread | None:
    """The thread an aiosqlite connection runs SQLite on (not yet started before its await),
    or None if this aiosqlite keeps it elsewhere.

    aiosqlite gives no public handle on it: from 0.22 it is the connection's ``_thread``;
    before, the connection was the thread itself."""
    thread = getattr(connection, "_thread", connection)  # no public handle (see above)
    return thread if isinstance(thread, threading.Thread) else None


async def prepare(conn: aiosqlite.Connection, path: Path, local_sync: str,
                  new_writer_id: str | None = None) -> str:
    """Refuse any file that is not ours, then set the pragmas, create or migrate the
    schema, and return the file's writer id (`new_writer_id` for a file made now, when
    given: the id its store already wrote under with the cache off; else a random one).
    Never wipes anything."""
    with wrap_errors(path, "open"):
        app_id = await _scalar(conn, "PRAGMA application_id")
        user_version = await _scalar(conn, "PRAGMA user_version")
        tables = await _scalar(conn, "SELECT count(*) FROM sqlite_master")
    if app_id != APPLICATION_ID and (app_id != 0 or tables != 0):
        raise CacheCorrupt(
            f"{path} is a SQLite database but not a localstate cache "
            f"(application_id {app_id:#x}); point cache_path at another file, "
            "this one was left untouched",
            path=str(path),
        )
    if app_id == APPLICATION_ID and user_version > SCHEMA_VERSION:
        raise SchemaError(
            f"the local cache {path} has schema version {user_version}, newer than "
            f"this localstate ({SCHEMA_VERSION}); upgrade localstate, or move the file "
            "aside to start an empty cache (its unflushed writes stay in it)"
        )
    with wrap_errors(path, "open"):
        quick = await _scalar(conn, "PRAGMA quick_check(1)")
        if quick != "ok":
            raise CacheCorrupt(
                f"the local cache {path} failed SQLite's quick_check ({quick}); "
                "move it aside (what it has flushed is safe in the central DB) and restart",
                path=str(path),
            )
        # before WAL mode and the first table: only then can a new file take it
        await choose_incremental(conn)
        # WAL: a commit appends to the -wal file instead of rewriting pages, readers (the
        # CLI, a backup) never block the writer, and a commit needs one fsync, not two.
        mode = await _scalar(conn, "PRAGMA journal_mode=WAL")
        if str(mode).lower() != "wal":
            raise CachePathNotWritable(
                f"{path} cannot use WAL mode (got {mode!r}); keep the cache on a "
                "local filesystem",
                path=str(path),
            )
        # FULL: every commit is fsynced, so a write acknowledged in `local` durability
        # survives power loss as well as a crash. Group commit spreads that one fsync over
        # every write staged meanwhile. NORMAL (an option) survives a process crash but
        # may lose the last commits on power loss.
        await conn.execute(f"PRAGMA synchronous={local_sync.upper()}")
        # A CLI reader or a backup may hold a read lock for a moment: wait, don't fail.
        await conn.execute("PRAGMA busy_timeout=5000")
        # Keep the -wal file from growing past 8 MiB after checkpoints (a soak stays flat).
        await conn.execute("PRAGMA journal_size_limit=8388608")
        await conn.execute("PRAGMA temp_store=MEMORY")
        if app_id == 0 or user_version < SCHEMA_VERSION:
            # One transaction (sqlite3 runs DDL in autocommit otherwise): a file has its
            # tables and its application_id together or neither, so a crash here never
            # leaves a file that later opens refuse as "not a localstate cache".
            await conn.execute("BEGIN IMMEDIATE")
            if app_id == 0:
                await conn.execute(SCHEMA)
            if app_id == 0 or user_version < 2:
                await conn.execute(META)
                await conn.execute("INSERT INTO meta VALUES ('writer_id', ?)",
                                   (new_writer_id or uuid.uuid4().hex,))
            await conn.execute(OUTBOX)
            await conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
            await conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            await conn.commit()
            if app_id == APPLICATION_ID:  # an existing file migrated: said once, here
                added = [what for version, what in _ADDED_BY if version > user_version]
                log.info("upgraded the local cache %s from schema version %d to %d (%s)",
                         path, user_version, SCHEMA_VERSION, "; ".join(added))
        if await convert_existing(conn):  # a file made before auto_vacuum, once
            log.info("the local cache %s now gives free pages back (auto_vacuum)", path)
        return str(await _scalar(conn, "SELECT value FROM meta WHERE name = 'writer_id'"))

async def take_closed_mark(conn: aiosqlite.Connection, path: Path) -> bool:
    """Whether the file's last process closed it cleanly (the ``closed`` mark); the mark is
    gone once this returns, committed, so a crash from now on finds none."""
    with wrap_errors(path, "open"):
        closed = await _scalar(conn, "SELECT count(*) FROM meta WHERE name = 'closed'")
        if closed:
            await conn.execute("DELETE FROM meta WHERE name = 'closed'")
            await conn.commit()
    return bool(closed)


async def mark_closed(conn: aiosqlite.Connection, path: Path) -> None:
    """Write the ``closed`` mark: call it only once the file holds everything the closing
    process had in memory (nothing staged, the last commit through)."""
    with wrap_errors(path, "close"):
        await conn.execute("INSERT OR REPLACE INTO meta VALUES ('closed', ?)",
                           (repr(time.time()),))
        await conn.commit()


async def _scalar(conn: aiosqlite.Connection, sql: str) -> Any:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return None if row is None else row[0]

@contextlib.contextmanager
def wrap_errors(path: Path, doing: str) -> Iterator[None]:
    """Turn sqlite3 errors into localstate's, naming the file and what to do."""
    try:
        yield
    except CacheError:
        raise
    except sqlite3.Error as exc:
        raise translate(exc, doing, path) from exc

def translate(exc: sqlite3.Error, doing: str, file: Path) -> CacheError:
    """The localstate error for an sqlite3 error met doing `doing` on `file`."""
    text = str(exc)
    path = str(file)
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
    kept = f" {KEPT}" if doing == "commit" else ""
    # SQLITE_FULL says "database or disk is full"; a full disk met while SQLite extends
    # its -shm file (an open, say) only says "disk I/O error": ask the filesystem
    if "disk is full" in text or ("disk I/O" in text and _no_space_left(file)):
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


def make_folder(folder: Path) -> None:
    """``mkdir -p folder``, durably: a new folder's name is only durable once its parent is
    fsynced, and a power loss would take an unsynced folder, and the cache in it, away.

    The folder itself, when made here, is private: mode 0700 (less what the umask takes);
    the parents it needs get the process's default, and a folder that exists is left as
    it is (its owner chose its mode)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    folder.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
    for created in reversed(missing):
        fsync_folder(created.parent)


def create_private(path: Path) -> None:
    """Create the empty file `path` with mode 0600 (less what the umask takes), unless it
    exists: SQLite then opens it as a new database, and gives its WAL and shared-memory
    files the same mode, where it would make them 0644."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE)
    except FileExistsError:
        return
    os.close(fd)


def fsync_folder(folder: Path) -> None:
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


def file_in_the_way(folder: Path) -> Path | None:
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
    return fs.f_bavail * fs.f_frsize < NEARLY_FULL
