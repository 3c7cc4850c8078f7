"""The exception tree: every error localstate raises is a `LocalStateError`.

    LocalStateError
    ├── InvalidInput                   bad arguments: nothing was written
    │   ├── InvalidName                an owner or key that is empty, too long or has control chars
    │   ├── ValueEncodingError         a value orjson cannot encode, NaN or infinity
    │   └── ValueTooLarge              an encoded value over `max_value_bytes`
    ├── ConfigError                    a setting with a bad value (names the setting and its source)
    ├── StoreClosed                    a call on a store after `close()`
    ├── VersionConflict                `compare_and_set` saw another version
    ├── VersionExhausted               a key at version 2^63 - 1: no write can follow it
    ├── WriteRejected                  the central DB refused a `central` write (conflict policy)
    ├── OwnerLost                      another writer claimed the owner (a higher claim epoch)
    ├── EventsUnsupported              emit where an event cannot commit with its watermark
    ├── SourcePositionLost             a queue no longer holds the messages after the watermark
    ├── CacheError                     the local cache file
    │   ├── CacheLocked                another live process holds the file
    │   ├── CacheCorrupt               not a SQLite file, or not a localstate cache
    │   ├── CacheWriteFailed           a local commit failed (I/O error, ...)
    │   │   └── CacheFull                  the disk (or filesystem) holding the cache is full
    │   └── CachePathNotWritable       the folder or file cannot be created or written
    ├── SchemaError                    a local or central schema newer than this code
    ├── AccessDenied                   the REST API refused the token (401 or 403; `status`)
    └── CentralError                   the central metadata DB
        └── CentralUnavailable         unreachable or failing past the wait allowed

Driver exceptions (sqlite3, aiosqlite, SQLAlchemy, asyncpg) never escape: they are wrapped in
one of these, with the driver's exception as `__cause__`.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "CacheCorrupt",
    "CacheError",
    "CacheFull",
    "CacheLocked",
    "CachePathNotWritable",
    "CacheWriteFailed",
    "CentralError",
    "CentralUnavailable",
    "ConfigError",
    "EventsUnsupported",
    "InvalidInput",
    "InvalidName",
    "LocalStateError",
    "OwnerLost",
    "SchemaError",
    "SourcePositionLost",
    "StoreClosed",
    "ValueEncodingError",
    "ValueTooLarge",
    "VersionConflict",
    "VersionExhausted",
    "WriteRejected",
    "reason",
]


class LocalStateError(Exception):
    """The root of every error localstate raises."""


class InvalidInput(LocalStateError, ValueError):
    """An argument was refused before anything was written."""


class InvalidName(InvalidInput):
    """An owner or key that is empty, too long, or holds control characters."""


class ValueEncodingError(InvalidInput):
    """A value that cannot be stored as JSON (unsupported type, NaN, infinity, >64-bit int)."""


class ValueTooLarge(InvalidInput):
    """An encoded value larger than the store's `max_value_bytes`."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class EventsUnsupported(LocalStateError):
    """`emit` was called where an event cannot commit with its watermark in one transaction:
    the ``airflow`` sink (Airflow's state store and its event path are two transactions), the
    cache turned off (direct mode), or a central DB without Airflow's tables for an asset's
    event. Nothing was written; the message says what to use instead."""


class SourcePositionLost(LocalStateError):
    """A queue watcher's watermark points at messages its source no longer holds: a Kafka
    offset past the partition's retention (or a partition gone), a Redis stream trimmed past
    the last entry read. The messages in between are gone: the watcher stops rather than skip
    them silently or replay the queue from its start."""

    def __init__(self, message: str, *, source: str, position: object,
                 earliest: object = None) -> None:
        super().__init__(message)
        #: the topic/partition or stream
        self.source = source
        #: the watermark's position there
        self.position = position
        #: the earliest position the source still holds, when known
        self.earliest = earliest


class ConfigError(LocalStateError, ValueError):
    """A setting with a value that is not allowed."""


class StoreClosed(LocalStateError, RuntimeError):
    """The store was closed; open a new one."""


class VersionConflict(LocalStateError):
    """`compare_and_set` expected one version and found another."""

    def __init__(self, message: str, *, expected: int, actual: int) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


class VersionExhausted(LocalStateError):
    """The key's version is 2^63 - 1, the largest its 64-bit column holds: no write or
    deletion can give it the next one. Nothing was written."""

    def __init__(self, message: str, *, owner: str, key: str) -> None:
        super().__init__(message)
        self.owner = owner
        self.key = key

    @classmethod
    def at_ceiling(cls, owner: str, key: str) -> VersionExhausted:
        return cls(f"owner {owner!r} key {key!r} is at the last version a key can have (2^63 "
                   "- 1 is the largest a version column holds): it can be neither written nor "
                   "deleted, and nothing was written. "
                   "Keep the value under a new key; to reuse this one, stop the triggers that "
                   "use it and delete its row from the central DB's localstate_state "
                   "table by hand", owner=owner, key=key)


class WriteRejected(LocalStateError):
    """The central DB kept its own record over this write (the key's conflict policy)."""


class OwnerLost(LocalStateError):
    """Another writer claimed this owner after this store did (`StateStore.claim`): the central
    DB refuses this store's writes of it, and the store refuses new ones. Claim it again to
    write it (a trigger that moved back here does so when it starts)."""

    def __init__(self, message: str, *, owner: str, epoch: int, current: int) -> None:
        super().__init__(message)
        self.owner = owner
        #: the claim epoch this store held
        self.epoch = epoch
        #: the owner's epoch in the central DB when the write was refused
        self.current = current

    @classmethod
    def claimed_since(cls, owner: str, current: int) -> OwnerLost:
        """A conditional claim refused: another writer claimed `owner` after the time given."""
        return cls(f"owner {owner!r} was claimed by another writer (epoch {current}) after "
                   "this store began to claim it: that writer holds it now", owner=owner,
                   epoch=0, current=current)


class CacheError(LocalStateError):
    """A problem with the local cache file; the message names the file."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class CacheLocked(CacheError):
    """Another live process holds the cache file."""


class CacheCorrupt(CacheError):
    """The file is not a SQLite database, or not a localstate cache."""


class CacheWriteFailed(CacheError):
    """A local commit failed; the write stays staged and is retried."""


class CacheFull(CacheWriteFailed):
    """The filesystem holding the cache is full: free space there, or move the cache."""


class CachePathNotWritable(CacheError):
    """The cache folder or file cannot be created or written."""


class SchemaError(LocalStateError):
    """A database whose schema is newer than this code (or otherwise unusable)."""


class AccessDenied(LocalStateError, PermissionError):
    """The REST API refused the call: no or an invalid token (401), or one that may not touch
    this owner or may not write (403). Nothing was read or written."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class CentralError(LocalStateError):
    """The central metadata DB failed."""


class CentralUnavailable(CentralError):
    """The central metadata DB could not be reached in the time allowed."""


def reason(exc: BaseException) -> str:
    """An exception as a log message's reason: never empty (``str(TimeoutError())`` is '')."""
    return str(exc) or type(exc).__name__
