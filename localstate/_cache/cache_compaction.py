"""Keeping the local cache file proportional to the working set, not to its history.

The file is a write-ahead buffer, not a replica of the central DB. Its rows are the entries in
memory and the writes the central DB lacks; a row leaves it when its entry leaves memory
(evicted, or released with its owner: `EntryTable` stages a purge with the drop), and a
deletion the central DB holds is purged as soon as it is flushed.

SQLite keeps the pages a deletion frees inside the file (its freelist) and reuses them for
new rows, so a steady churn does not grow the file; a working set that shrinks would leave it
at its largest, though. The file is therefore created with ``auto_vacuum = INCREMENTAL``,
which lets ``PRAGMA incremental_vacuum(N)`` give free pages back to the filesystem. The writer
task calls `Compactor.after_purges` after each commit that purged rows; every `_CHECK_EVERY`
purged rows it looks at the freelist and, when more than a quarter of the file (and at least
`_MIN_FREE_PAGES` pages) is free, vacuums down to a tenth free, so new rows still find room
without growing the file again. In WAL mode the file shrinks at the next checkpoint.

Invariants:

* ``auto_vacuum`` is chosen before anything writes the file's header: on a new file it must
  be set before WAL mode and before the first table (`choose_incremental`, which is a no-op
  on a file that has tables).
* A file made before this (``auto_vacuum = NONE``) is converted once, by a ``VACUUM`` at open
  (`convert_existing`): one transaction that rewrites the file; a crash midway leaves the
  file as it was, and the next open converts it then.
* A vacuum moves pages, never rows: it changes nothing any reader can see. One that fails is
  logged and retried at a later check; the commit before it stands.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, Final

import aiosqlite

__all__ = ["Compactor", "choose_incremental", "convert_existing", "file_bytes"]

log = logging.getLogger("localstate.local_cache")

#: ``PRAGMA auto_vacuum`` value of INCREMENTAL
INCREMENTAL: Final = 2
#: purged rows between two looks at the freelist
_CHECK_EVERY: Final = 1000
#: free pages below which the file is left as it is (4 KiB pages: 1 MiB)
_MIN_FREE_PAGES: Final = 256


async def choose_incremental(conn: aiosqlite.Connection) -> None:
    """Ask for ``auto_vacuum = INCREMENTAL``: takes effect when a new file gets its first
    table (call it before WAL mode is set); on a file with tables it changes nothing."""
    await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")


async def convert_existing(conn: aiosqlite.Connection) -> bool:
    """Convert a file made without ``auto_vacuum = INCREMENTAL`` (one ``VACUUM``); return
    whether it had to. Run it outside any transaction."""
    if await _scalar(conn, "PRAGMA auto_vacuum") == INCREMENTAL:
        return False
    await conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    await conn.execute("VACUUM")
    return True


class Compactor:
    """Gives a cache file's free pages back, now and then (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._purged_since_check = 0
        #: pages given back to the filesystem so far, for stats
        self.pages_vacuumed = 0

    async def after_purges(self, conn: aiosqlite.Connection, purged: int) -> int:
        """`purged` rows were just deleted and committed; vacuum when due. Returns the pages
        given back (0: not due, or it failed and is retried at a later check)."""
        self._purged_since_check += purged
        if self._purged_since_check < _CHECK_EVERY:
            return 0
        self._purged_since_check = 0
        try:
            free = int(await _scalar(conn, "PRAGMA freelist_count"))
            total = int(await _scalar(conn, "PRAGMA page_count"))
            if free < _MIN_FREE_PAGES or free * 4 < total:
                return 0
            give_back = free - total // 10
            # executescript steps the pragma to its end (one page per step)
            await conn.executescript(f"PRAGMA incremental_vacuum({give_back});")
        except sqlite3.Error as exc:
            log.warning("could not vacuum the local cache %s (%s); trying again later",
                        self.path, exc)
            return 0
        self.pages_vacuumed += give_back
        return give_back


def file_bytes(path: Path) -> int:
    """The bytes a cache file takes on disk now: the file and its WAL (0 for what is missing)."""
    total = 0
    for name in (path, path.with_name(path.name + "-wal")):
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return total


async def _scalar(conn: aiosqlite.Connection, sql: str) -> Any:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return None if row is None else row[0]
