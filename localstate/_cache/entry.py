"""`Entry`: the in-memory state of one state variable, shared by the store, cache and worker.

Also its conversions: an entry from a central row (made, or taken in place), the tombstone that
purges one from the local file, the public `Record` of one, and the version of a write whose
central base is unknown.

The store's map holds one `Entry` per ``(owner, key)``; the local cache writes entries, the sync
worker flushes them. An entry is *dirty* while the central DB does not hold its version
(``version != synced_version``).
"""

from __future__ import annotations

import time
from collections.abc import Container
from typing import TYPE_CHECKING, Any, Final

from localstate._core.codec import IMMUTABLE_TYPES, decode
from localstate._core.model import FlushState, Record, epoch_to_datetime

if TYPE_CHECKING:
    from localstate._core.rows import CentralRow

__all__ = [
    "NOT_DECODED", "UNKNOWN_BASE", "Entry", "StateKey", "entry_from_row", "purged", "record_of",
    "take_row", "unknown_base_version",
]

StateKey = tuple[str, str]

#: `Entry.obj` when the value is a container: decode `data` afresh for each reader.
NOT_DECODED: Final[Any] = object()

#: `Entry.synced_version` of a write made while its central record could not be read: the
#: central DB's version is unknown (the flush settles it, see `localstate._cache.entry_table`).
UNKNOWN_BASE: Final = -1

#: Versions given to writes whose base is unknown are POSIX microseconds (see
#: `unknown_base_version`): 1.8e15 today, exact as a JSON number (below 2**53) until 2255.
_MICROS: Final = 1_000_000

_now = time.time
#: the last version `unknown_base_version` gave (its versions only grow within a process)
_last_unknown = 0


class Entry:
    """One state variable in memory. Mutated only on the event loop's thread."""

    __slots__ = ("data", "obj", "synced_version", "updated_at", "updated_by", "used", "version")

    def __init__(
        self,
        data: str | None,
        obj: Any,
        version: int,
        updated_at: float,
        updated_by: str,
        synced_version: int,
    ) -> None:
        #: the JSON text of the value; None marks a deletion (a tombstone)
        self.data = data
        #: the decoded value when it is immutable (str, int, float, bool, None), else NOT_DECODED
        self.obj = obj
        #: local version: one more with every write
        self.version = version
        #: POSIX timestamp of the last write
        self.updated_at = updated_at
        self.updated_by = updated_by
        #: the version the central DB is known to hold; 0 when it holds none, UNKNOWN_BASE
        #: when it could not be read
        self.synced_version = synced_version
        #: read or written since the table's last eviction pass looked at it (its second
        #: chance: see `EntryTable.evict`)
        self.used = True

    @property
    def dirty(self) -> bool:
        return self.version != self.synced_version

    def __repr__(self) -> str:
        return (
            f"Entry(version={self.version}, synced={self.synced_version}, "
            f"deleted={self.data is None}, by={self.updated_by!r})"
        )


def _obj_of(data: str | None) -> Any:
    """`Entry.obj` for the JSON text `data`."""
    if data is None:
        return None
    value = decode(data)
    return value if type(value) in IMMUTABLE_TYPES else NOT_DECODED


def entry_from_row(row: CentralRow) -> Entry:
    """A clean entry holding the central row `row` (a tombstone when it is a deletion)."""
    return Entry(row.data, _obj_of(row.data), row.version, row.updated_at, row.updated_by,
                 row.version)


def take_row(e: Entry, row: CentralRow) -> None:
    """`e` becomes the clean entry of the central row `row`, in place."""
    e.data = row.data
    e.obj = _obj_of(row.data)
    e.version = e.synced_version = row.version
    e.updated_at = row.updated_at
    e.updated_by = row.updated_by


def unknown_base_version() -> int:
    """The version of a write whose central base is unknown and of which this store has no
    version to count on: the time in microseconds, and above any this process gave before.

    Central versions grow by one per write, so this exceeds every version the central DB can
    hold as long as the clocks of the writers agree within the number of microseconds that
    separate this write from the last one of that kind; and the versions it gives within one
    process only grow, even when the clock steps back. The flush carries it to the central DB
    (a write goes in at or above its own version), where direct writes count on from it.
    """
    global _last_unknown
    _last_unknown = max(int(_now() * _MICROS), _last_unknown + 1)
    return _last_unknown


def purged(e: Entry) -> Entry:
    """A clean tombstone of `e`: staged, it removes the row from the local file."""
    return Entry(None, None, e.version, e.updated_at, e.updated_by, e.version)


def record_of(k: StateKey, e: Entry, conflicted: Container[StateKey]) -> Record:
    """The public record of `k` held in `e` (which has a value); `conflicted`: the sync
    worker's keys whose last flush lost a conflict."""
    if e.dirty:
        state = FlushState.DIRTY
    elif k in conflicted:
        state = FlushState.CONFLICT
    else:
        state = FlushState.FLUSHED
    assert e.data is not None
    return Record(
        owner=k[0], key=k[1], value=decode(e.data), version=e.version,
        updated_at=epoch_to_datetime(e.updated_at), updated_by=e.updated_by,
        flush_state=state, central_version=max(e.synced_version, 0),  # UNKNOWN_BASE: 0
    )
