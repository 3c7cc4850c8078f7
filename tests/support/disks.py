"""Small real filesystems for the disk-fault tests: a tmpfs that fills up, a read-only folder.

A tmpfs of a few MiB, mounted by the test (as root: the CI machines and this project's sandbox
run the suite as root), is a real full disk: SQLite gets ``ENOSPC`` from the kernel exactly as
it would on a full ``/var``. A filler file takes every free block; removing it gives the space
back. Without root, `PageLimitDisk` stands in: SQLite's ``PRAGMA max_page_count`` on the cache's
connection makes the next commit that needs a new page fail with the same ``SQLITE_FULL``.

Root ignores permission bits, so a read-only folder for root is a read-only bind mount
(``EROFS``, refused to every user); without root, ``chmod 0o555`` does it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Final

from localstate import StateStore

__all__ = ["CAN_MOUNT", "PageLimitDisk", "ReadOnlyFolder", "TmpfsDisk", "files_under", "integrity",
           "sha256"]

#: mounting needs root; the suite runs as root in CI and in this project's sandbox
CAN_MOUNT: Final = os.geteuid() == 0

_CHUNKS: Final = (1 << 20, 4096, 1)  # big writes first, then every last block and byte


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_under(root: Path) -> dict[Path, str]:
    """The sha256 of every regular file under `root`: what a fault must leave as it was."""
    return {p: sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def integrity(path: Path) -> str:
    """SQLite's own check of a whole database file: "ok" or what is wrong."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


def _run(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")


def _unmount(folder: Path) -> None:
    try:
        _run("umount", str(folder))
    except RuntimeError:
        _run("umount", "--lazy", str(folder))  # still busy: detach now, freed when closed


class TmpfsDisk:
    """A tmpfs of `size` mounted at `folder`; `fill` takes all its space, `free` gives it back."""

    restart_while_full = True  # the fault outlives the process: a restart meets it too

    def __init__(self, folder: Path, size: str = "4m") -> None:
        self.folder = folder
        self.size = size
        self.filler = folder / "filler"
        self._mounted = False

    def mount(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "localstate-test",
             str(self.folder))
        self._mounted = True

    def unmount(self) -> None:
        if self._mounted:
            self._mounted = False
            _unmount(self.folder)

    async def fill(self, _store: StateStore | None = None) -> int:
        """Write the filler until the kernel says ENOSPC; return its size in bytes."""
        written = 0
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for chunk in _CHUNKS:
                block = b"\0" * chunk
                while True:
                    try:
                        written += os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return written

    async def free(self, _store: StateStore | None = None) -> None:
        self.filler.unlink()


class PageLimitDisk:
    """Without root: the cache's own connection may not grow the file past its current pages."""

    restart_while_full = False  # the limit belongs to one connection: a restart is free of it

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @staticmethod
    async def _pragma(store: StateStore | None, sql: str) -> int:
        assert store is not None, "the page limit is set on an open store's cache connection"
        cache = store.local_cache
        conn = cache._conn if cache is not None else None
        assert conn is not None
        async with conn.execute(sql) as cursor:
            row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    async def fill(self, store: StateStore | None = None) -> int:
        pages = await self._pragma(store, "PRAGMA page_count")
        return await self._pragma(store, f"PRAGMA max_page_count={pages}")

    async def free(self, store: StateStore | None = None) -> None:
        await self._pragma(store, "PRAGMA max_page_count=4294967294")


class ReadOnlyFolder:
    """`folder` made read-only for every user (root included), and writable again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._mounted = False
        self._mode: int | None = None

    def make_read_only(self) -> None:
        if CAN_MOUNT:
            _run("mount", "--bind", str(self.folder), str(self.folder))
            self._mounted = True
            _run("mount", "-o", "remount,bind,ro", str(self.folder))
        else:
            self._mode = self.folder.stat().st_mode & 0o777
            self.folder.chmod(0o555)

    def make_writable(self) -> None:
        if self._mounted:
            self._mounted = False
            _unmount(self.folder)
        elif self._mode is not None:
            self.folder.chmod(self._mode)
            self._mode = None
