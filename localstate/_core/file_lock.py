"""One live process per cache file: an advisory ``flock`` on ``<cache>.lock``.

The kernel drops a ``flock`` when the process holding it dies, however it dies (SIGKILL included),
so a lock left by a dead process is never in the way: the next process takes it and rewrites the
holder line. The lock file also says who holds it (pid, host, triggerer id, since when), which the
error for a second live process quotes. ``flock`` locks belong to an open file description, so a
second open of the same cache inside one process is refused too.

Keep the cache on a local disk: ``flock`` over NFS is not reliable.

The holder line is never fsynced: it only informs, the ``flock`` is what excludes. After a power
loss the lock file may be missing, empty or torn, and `acquire` takes any of them over
(tests/faults/test_power_loss.py opens such images).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from pathlib import Path

import orjson

from localstate.errors import CacheLocked, CachePathNotWritable

__all__ = ["CacheFileLock"]

log = logging.getLogger("localstate.file_lock")


class CacheFileLock:
    """An exclusive lock on one cache file, held until `release()`."""

    def __init__(self, cache_path: Path, *, owner_id: str) -> None:
        self.cache_path = cache_path
        self.lock_path = cache_path.with_name(cache_path.name + ".lock")
        self._owner_id = owner_id
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise `CacheLocked` naming the live holder."""
        if self._fd is not None:
            return
        try:
            # private as the cache file beside it (less what the umask takes)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise CachePathNotWritable(
                f"cannot create the lock file {self.lock_path} of the local cache "
                f"{self.cache_path}: {exc.strerror}; make the cache folder writable or set "
                "cache_dir to a writable folder",
                path=str(self.cache_path),
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise CacheLocked(
                f"the local cache {self.cache_path} is in use by another live process "
                f"({holder}); each triggerer needs its own cache file: stop that process, or "
                "give this one another triggerer_id or cache_path",
                path=str(self.cache_path),
            ) from None
        except OSError as exc:
            os.close(fd)
            raise CachePathNotWritable(
                f"cannot lock {self.lock_path} of the local cache {self.cache_path}: "
                f"{exc.strerror}; keep the cache on a local filesystem that supports flock "
                "(set cache_dir)",
                path=str(self.cache_path),
            ) from exc
        previous = _read_holder(fd)
        if previous != "unknown holder":
            log.info("taking over %s, last held by %s (no longer running)", self.lock_path,
                     previous)
        stamp = orjson.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "owner_id": self._owner_id,
                "since": time.time(),
            }
        )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, stamp, 0)
        except OSError as exc:
            # The holder line only feeds the error a second process gets; the flock is what
            # excludes it. On a full disk (ENOSPC) the SQLite open that follows says what is
            # wrong (CacheFull), naming the cache file rather than its lock.
            log.warning("cannot write the holder of %s (%s); holding the lock anyway",
                        self.lock_path, exc.strerror)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock; safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the descriptor drops the flock


def _read_holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0)
        info = orjson.loads(raw) if raw else None
    except (OSError, orjson.JSONDecodeError):
        info = None
    if not isinstance(info, dict):
        return "unknown holder"
    return (
        f"pid {info.get('pid')} on host {info.get('host')}, id {info.get('owner_id')!r}, "
        f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(float(info.get('since', 0))))}"
    )
