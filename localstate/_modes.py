"""`Mode`: what a store does off its hot path, in local-first or in direct mode.

A `StateStore` holds one mode at a time and hands it every call that is not served from memory
(inside its `ModeGate`): `LocalFirstMode` (`localstate._local_first`) keeps the entries in the
store's `EntryTable` in front of a local cache and a sync worker, which it owns; `DirectMode`
sends every call to the central DB, one transaction each, and keeps nothing in memory. The
store's live toggle (``enabled``) replaces one with the other under the gate's switch.

Both modes read the `StoreParts` the store opens once and closes once: the sink to the central
DB, the read-through in front of it, the store's `EntryTable`, its name, conflict policies and
conflict callback. They are fixed from the open to the close; a mode owns only what it opens
itself (the local cache and the sync worker of local-first mode).

Every `durability` a mode is given has been checked by the store (`check_durability`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from localstate._cache.entry import Entry, StateKey, entry_from_row, record_of
from localstate._cache.entry_table import EntryTable
from localstate._core.conflicts import PolicyMap
from localstate._core.model import Durability, FlushState, Record, check_key, check_name
from localstate._core.rows import CentralRow
from localstate._sync.flush.claims import ClaimBook
from localstate._sync.flush.settle import ConflictInfo, FlushReport
from localstate._sync.sinks.read_through import ReadThrough
from localstate._sync.sinks.sink import Sink
from localstate.errors import LocalStateError

if TYPE_CHECKING:
    from localstate._cache.local_cache import LocalCache
    from localstate._core.config import Settings
    from localstate._core.file_lock import CacheFileLock
    from localstate._sync.flush.worker import SyncWorker

__all__ = ["DirectMode", "Mode", "NotOpen", "StoreParts", "Unflushed"]

_T = TypeVar("_T")

#: a dirty key, or one whose last flush lost a conflict, with its entry (see `store.unflushed`)
Unflushed = tuple[StateKey, Entry, FlushState]


@dataclass(frozen=True, slots=True)
class StoreParts:
    """What both of a store's modes share, opened once and closed once (`StateStore` opens
    them; see the module docstring)."""

    table: EntryTable
    sink: Sink
    reader: ReadThrough
    triggerer_id: str
    policies: PolicyMap
    on_conflict: Callable[[ConflictInfo], None] | None
    #: the claim epochs the store holds and the owners it lost (see `StateStore.claim`)
    claims: ClaimBook
    #: the store opened the sink (and closes it); a sink given to the store is the caller's
    owns_sink: bool

    async def close(self) -> None:
        """Close the read-through and (when the store opened it) the sink."""
        await self.reader.close()
        if self.owns_sink:
            await self.sink.close()


def _require_open(part: _T | None) -> _T:
    """A part of the store that exists once it is open (and, for the cache, enabled)."""
    if part is None:
        raise LocalStateError(
            "the store is not open (use `await StateStore.open(...)`), or this call needs the "
            "local cache (enabled=True)"
        )
    return part


class Mode(Protocol):
    #: the parts of the local-first mode; None in direct mode
    @property
    def worker(self) -> SyncWorker | None: ...
    @property
    def cache(self) -> LocalCache | None: ...

    def conflicted(self) -> Container[StateKey]:
        """The keys whose last flush lost a conflict."""
    async def read(self, k: StateKey) -> Entry | None:
        """The entry of `k` (names not yet checked), or None: it has no record."""
    async def read_central(self, k: StateKey) -> CentralRow | None:
        """`k`'s central record, read now with a query of its own (not joining a read in
        flight, which could return a row read before this call began)."""
    async def set(self, k: StateKey, data: str, obj: object, durability: Durability) -> int:
        """A set of `k` not served by the hot path (a key not in memory, or direct mode)."""
    async def compare_and_set(self, k: StateKey, data: str, obj: object,
                              expected_version: int, durability: Durability) -> int: ...
    async def delete(self, k: StateKey, durability: Durability) -> bool: ...
    async def persist(self, k: StateKey, e: Entry, version: int, durability: Durability
                      ) -> int:
        """Wait until the hot path's write `version` of `k` holds at `durability`."""
    async def records(self, owner: str) -> list[Record]:
        """The records of `owner` this mode holds, in key order (names already checked)."""
    async def load(self, owner: str) -> int: ...
    async def flush(self) -> FlushReport: ...
    async def sync_local(self) -> None: ...
    def unflushed(self, keys: Iterable[StateKey] | None = None) -> list[Unflushed]: ...
    def retune(self, settings: Settings) -> None: ...
    async def stop(self, timeout: float) -> None:
        """Stop flushing, after a last flush of up to `timeout` seconds (the store closes)."""
    async def close(self) -> None:
        """Close what the mode opened (after `stop`)."""


class DirectMode:
    """Every call on the central DB, one transaction each; nothing kept in memory.

    Its writes carry the store's writer id (`writer`), so that a later flush of the store's
    cache file sees these rows as its own chain: one store is one writer, whatever the mode it
    wrote in. With a cache file, its id, and the file's lock is held meanwhile (`lock`), so no
    other process can write under that id. Without one (none exists yet, another live process
    holds it, it cannot be opened), a random id of this store's own, which a cache file created
    by turning the cache on takes (`new_writer_id`).
    """

    worker: None = None
    cache: None = None

    def __init__(self, parts: StoreParts, lock: CacheFileLock | None = None,
                 writer: str | None = None) -> None:
        self.parts = parts
        if lock is not None and not lock.held:  # the file's id is not this store's alone
            lock, writer = None, None
        #: the cache file's lock, held while this mode writes under its id (None: no file)
        self.lock = lock
        self.writer = writer or uuid.uuid4().hex

    def lost_file(self) -> None:
        """The cache file's lock went (a failed open of the cache released it): write under
        an id of this store's own from now on."""
        self.lock = None
        self.writer = uuid.uuid4().hex

    def conflicted(self) -> Container[StateKey]:
        return frozenset()

    async def read(self, k: StateKey) -> Entry | None:
        check_key(k)
        row = (await self.parts.sink.read_many([k])).get(k)
        return None if row is None else entry_from_row(row)

    async def read_central(self, k: StateKey) -> CentralRow | None:
        return (await self.parts.sink.read_many([k])).get(k)

    async def set(self, k: StateKey, data: str, obj: object, durability: Durability) -> int:
        self._count_write(k)
        row = await self.parts.sink.write_direct(
            k[0], k[1], data, updated_at=time.time(), updated_by=self.parts.triggerer_id,
            writer=self.writer)
        return row.version

    async def compare_and_set(self, k: StateKey, data: str, obj: object,
                              expected_version: int, durability: Durability) -> int:
        """One conditional statement on the committed version."""
        self._count_write(k)
        row = await self.parts.sink.write_if_version(
            k[0], k[1], data, expected_version, updated_by=self.parts.triggerer_id,
            updated_at=time.time(), writer=self.writer)
        return row.version

    async def delete(self, k: StateKey, durability: Durability) -> bool:
        """A compare-and-delete of the value it reads."""
        self._count_write(k)
        return await self.parts.sink.delete_current(k[0], k[1],
                                                    updated_by=self.parts.triggerer_id,
                                                    writer=self.writer)

    async def persist(self, k: StateKey, e: Entry, version: int, durability: Durability
                      ) -> int:
        raise AssertionError("direct mode has no entries in memory to persist")

    async def records(self, owner: str) -> list[Record]:
        rows = await self.parts.sink.read_owner(owner)
        return [record_of((r.owner, r.key), entry_from_row(r), ())
                for r in rows if r.data is not None]

    async def load(self, owner: str) -> int:
        rows = await self.parts.sink.read_owner(owner)
        return sum(1 for r in rows if r.data is not None)

    async def flush(self) -> FlushReport:
        return FlushReport()

    async def sync_local(self) -> None:
        return None

    def unflushed(self, keys: Iterable[StateKey] | None = None) -> list[Unflushed]:
        return []

    def retune(self, settings: Settings) -> None:
        return None

    async def stop(self, timeout: float) -> None:
        return None

    async def close(self) -> None:
        """Let the cache file go (its lock)."""
        if self.lock is not None:
            self.lock.release()

    def _count_write(self, k: StateKey) -> None:
        """Check a direct write's names (nothing in memory checks them) and count it."""
        check_name("owner", k[0])
        check_name("key", k[1])
        self.parts.table.count_direct_write()


class NotOpen:
    """The mode of a store not opened yet: every call but the figures says so."""

    worker: None = None
    cache: None = None

    def conflicted(self) -> Container[StateKey]:
        return frozenset()

    def unflushed(self, keys: Iterable[StateKey] | None = None) -> list[Unflushed]:
        return []

    async def sync_local(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        _require_open(None)  # raises
