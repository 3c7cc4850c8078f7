"""`EntryTable`: the one owner of a store's in-memory state.

It holds three maps and is the only code that changes them:

``entries``
    one `Entry` per ``(owner, key)`` the store holds in memory.
``dirty``
    the keys whose entry the central DB does not hold yet, each with the time of the oldest
    write it lacks, in the order they went dirty: the order flushes take them in.
``absent``
    keys the central DB was read and found to lack, each until ``absent_ttl`` runs out.

Its operations are the only ways the state moves:

* `write` (the hot path of every set and delete), `write_first` (a key not yet in memory);
* `collect_dirty` (a flush's snapshot) and `settle_written` / `settle_moved` /
  `settle_adopted` (what a flush's outcome does to an entry);
* `adopt` (a row read from the central DB), `first_write_base`, the absent-key bookkeeping;
* `fill` and `forget_all` (the cache turned on or off);
* `evict` (the bounded working set: ``max_keys_in_memory``) and `release` (an owner that
  left this store: see `StateStore.release`).

Invariants:

* An entry's ``version`` and ``synced_version`` never go backwards while the store runs,
  except when a flush's conflict hands the key to the central record (then the entry becomes
  the central record). A row read from the central DB is adopted only when the entry is clean
  and the row is newer (``row.version > entry.version``): a row read before a flush it raced
  with can never put the entry back.
* An entry is dirty iff ``version != synced_version``; exactly the dirty entries are in
  ``dirty`` (`collect_dirty` drops keys that became clean).
* ``synced_version == UNKNOWN_BASE`` marks a write based on a central record that could not
  be read (the central DB was down), or was not read (`set_reads_base`). Its version counts
  on from 0 when this store last saw the key absent (it has shown no version of it since),
  else from `entry.unknown_base_version` (the clock: above any version the central DB can
  hold); the flush settles it like a write whose base turned out stale, and a central row of
  this store's own chain is simply replaced (see `localstate._sync.central.fenced_write`).
* A key the central DB lacks is never kept as an entry unless this store writes it: the
  absence is remembered for ``absent_ttl`` seconds, no longer (`AbsentKeys`).
* Only clean entries are evicted or released, and never one the worker still needs
  (`pinned`: a central waiter, a conflict to report). An evicted or released key's record is
  the central DB's; its row leaves the local file too (a purge is staged with the drop), so
  the file holds the working set and the writes the central DB lacks, not history.
* A row read from the central DB while an entry of its owner was dropped may predate the
  version dropped, so it neither adds an entry nor marks a key absent; the reader reads
  again. The reader tells by `read_epoch`, taken before the read's query began (the
  read-through never answers a fetch from a query already running:
  `localstate._sync.sinks.read_through`). It moves with every way an entry leaves the map: every
  eviction pass (``evictions``), every release of its owner (`OwnerIndex`, which holds
  exactly the keys of ``entries``, grouped by owner), and the map emptied or refilled when the
  cache is turned off or on (``resets``). Without it, a row read before a write this store
  made, acknowledged and then dropped would bring the key back below that write, and the
  flush's fence would take a write based on it for a replay of this store's own chain
  (`localstate._sync.central.fenced_write`, invariant 4): the acknowledged write would be lost.
* Eviction is amortized, by a second-chance bit (`localstate._cache.eviction`).

Everything here runs on the event loop's thread, synchronously: nothing sees a change half made.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from localstate._cache.absent_keys import AbsentKeys
from localstate._cache.entry import (
    UNKNOWN_BASE,
    Entry,
    StateKey,
    entry_from_row,
    purged,
    take_row,
    unknown_base_version,
)
from localstate._cache.eviction import grown, second_chance_scan
from localstate._cache.local_cache import LocalCache
from localstate._cache.owner_index import OwnerIndex
from localstate._core.rows import CentralRow, DirtyRow
from localstate.errors import VersionExhausted

#: the last version a write may make: 2^63 - 2, one below the ceiling of the BIGINT columns
#: (a key at the ceiling could never be written or deleted again; the API refuses it too)
_LAST_VERSION = 2**63 - 2

__all__ = ["EntryTable"]

_now = time.time

class EntryTable:
    """Entries, dirty keys and absent keys of one store (see the module docstring)."""

    # slots: `write` runs on every set, and a slot read is cheaper than an instance-dict one
    __slots__ = ("_absent", "_cache", "_evict_at", "_owners", "dirty", "entries", "evictions",
                 "kick_at", "max_keys", "on_full", "pinned", "released", "resets", "sets",
                 "updated_by")

    def __init__(self, *, updated_by: str, kick_at: int, absent_ttl: float,
                 max_keys: int = 100_000) -> None:
        #: read by the store's hot path directly (one dict lookup); changed only here
        self.entries: dict[StateKey, Entry] = {}
        self.dirty: dict[StateKey, float] = {}
        self._absent = AbsentKeys(absent_ttl, seen_cap=max_keys)
        #: the keys of `entries` by owner, and the owners' drop epochs
        self._owners = OwnerIndex()
        self.updated_by = updated_by
        #: this many dirty keys start a flush at once (`on_full`)
        self.kick_at = kick_at
        self._cache: LocalCache | None = None
        self.on_full: Callable[[], None] = _nothing
        #: writes made (sets and deletes), for stats
        self.sets = 0
        #: clean entries beyond this many are evicted (`evict`)
        self.max_keys = max_keys
        self._evict_at = grown(max_keys)
        #: entries evicted so far: stats, and the epoch of the reads (see the module docstring)
        self.evictions = 0
        #: entries dropped by `release` so far, for stats
        self.released = 0
        #: times the whole map was emptied or refilled (`fill`, `forget_all`): read epochs
        self.resets = 0
        #: whether the sync worker still needs `k`'s entry in memory
        self.pinned: Callable[[StateKey], bool] = _never

    @property
    def by_owner(self) -> dict[str, set[str]]:
        """The keys held, by owner (read it; the table changes it)."""
        return self._owners.by_owner

    # -- the cache turned on and off -----------------------------------------------------

    def fill(self, cache: LocalCache, entries: dict[StateKey, Entry], *, keep_clean: bool,
             on_full: Callable[[], None], pinned: Callable[[StateKey], bool]) -> None:
        """Take the entries loaded from `cache` (which the table stages to from now on).

        `pinned`: the sync worker's `holds` (entries it still needs in memory).

        `keep_clean=False` (the cache turned on at run time) keeps only the writes the central
        DB lacks: a clean row may be older than what was written centrally meanwhile, so it is
        dropped (from the file too) and read through when asked for.
        """
        if not keep_clean:
            stale = {k: e for k, e in entries.items() if not e.dirty}
            cache.stage_many({k: purged(e) for k, e in stale.items()})
            entries = {k: e for k, e in entries.items() if e.dirty}
        self._cache = cache
        self.on_full = on_full
        self.pinned = pinned
        self.entries.clear()
        self.entries.update(entries)
        self.resets += 1
        self._owners.reset(entries)
        self.dirty.clear()
        self.dirty.update({k: e.updated_at for k, e in entries.items() if e.dirty})
        self._absent.clear()
        self._joined()

    def forget_all(self, *, purge: bool) -> None:
        """Drop every entry (the cache is turned off or failed to turn on).

        `purge`: stage a purge of every row first, so that the file holds nothing a later
        start could serve after the central DB moved on.
        """
        if purge and self._cache is not None:
            self._cache.stage_many({k: purged(e) for k, e in self.entries.items()})
        self._cache = None
        self.on_full = _nothing
        self.pinned = _never
        self.entries.clear()
        self.resets += 1
        self._owners.reset(())
        self.dirty.clear()
        self._absent.clear()

    # -- writing -------------------------------------------------------------------------

    def write(self, k: StateKey, e: Entry, data: str | None, obj: Any, memory: bool) -> int:
        """Make a write in `e` (the entry of `k`); return its version. The hot path: kept flat.

        `memory`: the write's durability is ``memory``: it is staged for the local writer
        here (the other durabilities commit it themselves, see `LocalCache.commit`).
        """
        if e.version >= _LAST_VERSION:  # the next would not fit a version column
            raise VersionExhausted.at_ceiling(*k)
        e.data = data
        e.obj = obj
        version = e.version = e.version + 1
        e.updated_at = now = _now()
        e.updated_by = self.updated_by
        dirty = self.dirty
        if k not in dirty:
            dirty[k] = now
        self.sets += 1
        if len(dirty) >= self.kick_at:
            self.on_full()
        if memory:
            self._cache.stage(k, e)  # type: ignore[union-attr]  # filled whenever written
        return version

    def write_first(self, k: StateKey, e: Entry, data: str | None, obj: Any,
                    memory: bool) -> int:
        """`write` of an entry `first_write_base` made: it joins the table now."""
        if e.version >= _LAST_VERSION:  # before it joins: a refused write leaves nothing
            raise VersionExhausted.at_ceiling(*k)
        held = self.entries.setdefault(k, e)
        assert held is e, "first_write_base and write_first run without an await between"
        self._owners.add(*k)
        self._absent.discard(k)
        version = self.write(k, e, data, obj, memory)
        self._joined()
        return version

    def first_write_base(self, k: StateKey, row: CentralRow | None, *, unknown: bool = False
                         ) -> Entry:
        """The entry a write of `k` is based on: the one in memory, else one made from `row`.

        `unknown`: the central record could not be read; the entry is based on
        `UNKNOWN_BASE`. A new entry joins the table only through `write_first`: a call that
        does not write (a compare-and-set that fails) leaves nothing behind. `row` (or its
        absence) was read with no drop of an entry of its owner since (`read_epoch`).
        """
        e = self.entries.get(k)
        if e is not None:
            return e
        if unknown:
            # numbered from 0 when this store last saw `k` absent (it has shown no version of
            # it since), else from the clock: above any version the central DB can hold
            last = 0 if self._absent.seen_absent(k) else unknown_base_version() - 1
            return Entry(None, None, last, 0.0, self.updated_by, UNKNOWN_BASE)
        if row is None:
            return Entry(None, None, 0, 0.0, self.updated_by, 0)
        return entry_from_row(row)

    # -- reads from the central DB -------------------------------------------------------

    def adopt(self, k: StateKey, row: CentralRow, since: int) -> Entry | None:
        """Take the central row `row` of `k`, read a moment ago; return the entry now held.

        `since`: `read_epoch` of `k`'s owner when the read began. A new key gets the row,
        unless an entry was dropped meanwhile (it may have been `k` at a newer version: None,
        read again). A
        held entry takes it only when it is clean and the row is newer: a dirty entry is the
        flush's to reconcile, and a row no newer than the entry may have been read before a
        flush moved the entry on.
        """
        e = self.entries.get(k)
        if e is None:
            if since != self.read_epoch(k[0]):
                return None
            self._absent.discard(k)
            e = self.entries[k] = entry_from_row(row)
            self._owners.add(*k)
            self._stage(k, e)
            self._joined()
            return e
        self._absent.discard(k)
        if e.dirty or row.version <= e.version:
            return e
        take_row(e, row)
        self._stage(k, e)
        return e

    def is_absent(self, k: StateKey) -> bool:
        """Whether `k` was found missing centrally less than ``absent_ttl`` seconds ago."""
        return k in self._absent

    def mark_absent(self, k: StateKey, since: int) -> bool:
        """The central DB lacks `k` (a read begun at `since` found no row), unless this store
        holds it. False: an entry of its owner was dropped since the read began (read again).
        """
        if since != self.read_epoch(k[0]):
            return False
        if k not in self.entries:
            self._absent.mark(k)
        return True

    def read_epoch(self, owner: str) -> int:
        """A number that moves whenever an entry of `owner` may have been dropped: take it
        before a central read, pass it to `adopt` / `mark_absent` (see the module docstring)."""
        return self.evictions + self.resets + self._owners.drop_epoch(owner)

    # -- a flush's steps -----------------------------------------------------------------

    def collect_dirty(self, keys: Iterable[StateKey] | None = None) -> list[DirtyRow]:
        """A snapshot of the dirty entries among `keys` (default: every dirty key)."""
        rows: list[DirtyRow] = []
        entries, dirty = self.entries, self.dirty
        for k in (list(dirty) if keys is None else keys):
            e = entries.get(k)
            if e is None or not e.dirty:
                dirty.pop(k, None)
                continue
            rows.append(
                DirtyRow(k[0], k[1], e.data, e.version, e.synced_version, e.updated_at,
                         e.updated_by)
            )
        return rows

    def settle_written(self, k: StateKey, e: Entry, central_version: int) -> float | None:
        """The central DB holds exactly `e` now, at `central_version`: `e` is clean.

        Returns when `k` became dirty (None if it was not in the dirty map).
        """
        e.version = e.synced_version = central_version
        e.used = True  # written since the last pass (a write's recency, off the hot path)
        return self.dirty.pop(k, None)

    def settle_moved(self, e: Entry, central_version: int) -> None:
        """The central DB holds `central_version` of `e`'s chain while `e` was written again
        meanwhile: those writes go out next, based on it, at versions above it."""
        e.synced_version = central_version
        if e.version <= central_version:
            e.version = central_version + 1

    def settle_adopted(self, e: Entry, central: CentralRow) -> None:
        """The central record replaces `e` (a conflict it won, or this writer's newer chain)."""
        take_row(e, central)

    def after_settle(self, k: StateKey, e: Entry, started_at: float) -> None:
        """Keep `dirty` in step with `e` after a flush settled it; the flush started then."""
        if not e.dirty:
            self.dirty.pop(k, None)
        else:
            # Written again during the flush: those writes are no older than its start, and
            # the key goes to the back of the dirty map, behind the keys this flush had no
            # time for. Assigning in place would keep its place at the front: a bounded flush
            # (the airflow sink's) would take the same hot keys every time and starve the rest.
            self.dirty.pop(k, None)
            self.dirty[k] = started_at

    def stage_settled(self, entries: dict[StateKey, Entry]) -> None:
        """Have the local writer record what a flush settled; evict what it made evictable."""
        if self._cache is not None:
            self._cache.stage_many(entries)
        if len(self.entries) > grown(self.max_keys):
            self.evict()

    # -- the bounded working set ---------------------------------------------------------

    def evict(self, down_to: int | None = None) -> int:
        """Evict least recently used clean entries until `down_to` (``max_keys``) remain.

        The scan: `localstate._cache.eviction`. Returns how many were evicted; the next pass waits
        for a tenth more keys.
        """
        entries = self.entries
        target = self.max_keys if down_to is None else down_to
        gone = second_chance_scan(entries, self.dirty, self.pinned, len(entries) - target)
        evicted = len(gone)
        if gone:
            self._dropped(gone)
        self.evictions += evicted
        self._evict_at = grown(max(len(entries), self.max_keys))
        return evicted

    def release(self, owner: str) -> tuple[int, int]:
        """Drop `owner`'s clean entries that nothing pins (from memory and, by a staged
        purge, from the local file); return how many were dropped and how many stay (dirty:
        written during the release; pinned: awaited or in conflict)."""
        keys = self._owners.by_owner.get(owner)
        if not keys:
            return 0, 0
        entries, dirty, pinned = self.entries, self.dirty, self.pinned
        held = len(keys)
        gone: dict[StateKey, Entry] = {}
        for key in list(keys):
            k = (owner, key)
            e = entries[k]
            if e.version == e.synced_version and k not in dirty and not pinned(k):
                gone[k] = entries.pop(k)
        if gone:
            self._owners.released(owner)
            self._dropped(gone)
            self.released += len(gone)
        return len(gone), held - len(gone)

    def keys_of(self, owner: str) -> list[StateKey]:
        """The keys of `owner` held in memory now."""
        return self._owners.keys_of(owner)

    def _dropped(self, gone: dict[StateKey, Entry]) -> None:
        """Entries just taken out of `entries`: out of the index, and out of the file."""
        self._owners.remove(gone)
        if self._cache is not None:
            self._cache.stage_many({k: purged(e) for k, e in gone.items()})

    def _joined(self) -> None:
        """A key joined the map: a pass when it has grown by a tenth since the last one."""
        if len(self.entries) > self._evict_at:
            self.evict()

    def count_direct_write(self) -> None:
        """A write the store made straight to the central DB (cache off), for stats."""
        self.sets += 1

    # -- figures -------------------------------------------------------------------------

    def oldest_dirty(self) -> float | None:
        """The time of the oldest write the central DB lacks (None: nothing is dirty)."""
        return min(self.dirty.values(), default=None)

    def _stage(self, k: StateKey, e: Entry) -> None:
        if self._cache is not None:
            self._cache.stage(k, e)


def _nothing() -> None:
    return None


def _never(k: StateKey) -> bool:
    return False
