"""`Entry`: the in-memory state of one state variable, shared by the store, cache and worker.

The store's map holds one `Entry` per ``(owner, key)``; the local cache writes entries, the sync
worker flushes them. An entry is *dirty* while the central DB does not hold its version
(``version != synced_version``).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["NOT_DECODED", "Entry", "StateKey"]

StateKey = tuple[str, str]

#: `Entry.obj` when the value is a container: decode `data` afresh for each reader.
NOT_DECODED: Final[Any] = object()


class Entry:
    """One state variable in memory. Mutated only on the event loop's thread."""

    __slots__ = ("data", "obj", "synced_version", "updated_at", "updated_by", "version")

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
        #: the version the central DB is known to hold; 0 when it holds none
        self.synced_version = synced_version

    @property
    def dirty(self) -> bool:
        return self.version != self.synced_version

    def __repr__(self) -> str:
        return (
            f"Entry(version={self.version}, synced={self.synced_version}, "
            f"deleted={self.data is None}, by={self.updated_by!r})"
        )
