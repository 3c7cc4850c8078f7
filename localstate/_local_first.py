"""`LocalFirstMode`: a store's calls off the hot path with the local cache on.

It owns the local cache and the sync worker: `start` opens them (loading the cache file into the
store's `EntryTable`), `close` and `drain_and_stop` end them. Entries live in the `EntryTable`
and change only through its operations; this mode decides which operation a call makes:
a first write is based on the key's central record (`first_write_base`), a compare-and-set or
delete in ``central`` durability decides on the committed record (`_committed_base`), and
`persist` waits until a write holds at its durability.

The reads of the central DB for keys not in memory are at the end of this file: a key not in
memory is read through (`known_entry`), a key written for the first time is based on its
central record (`first_write_base`), and `load_owner` adopts an owner's rows in one query.
Every row read goes into the `EntryTable` through `EntryTable.adopt`, which never lowers an
entry. None of this is on the hot path: a known key never gets here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Container, Iterable

from localstate._cache.entry import UNKNOWN_BASE, Entry, StateKey, record_of
from localstate._cache.entry_table import EntryTable
from localstate._cache.local_cache import LocalCache
from localstate._cache.outbox import Outbox
from localstate._core.config import Settings
from localstate._core.conflicts import ConflictPolicy
from localstate._core.file_lock import CacheFileLock
from localstate._core.model import (
    Durability,
    FlushState,
    Record,
    check_key,
    check_name,
    refuse_unhashable_names,
)
from localstate._core.rows import CentralRow
from localstate._modes import StoreParts, Unflushed
from localstate._sync.flush.settle import FlushReport
from localstate._sync.flush.worker import SyncWorker
from localstate._sync.sinks.read_through import ReadThrough
from localstate._sync.sinks.sink import Sink
from localstate.errors import CentralError, CentralUnavailable, VersionConflict, WriteRejected

__all__ = ["LocalFirstMode", "first_write_base", "known_entry", "load_owner", "set_reads_base"]

# the store's logger: what this mode logs is the store's
log = logging.getLogger("localstate.store")
#: rounds a central-durability compare-and-set makes when its flush meets an unseen commit
_CAS_ROUNDS = 3


class LocalFirstMode:
    """Entries in memory, a local cache file behind them, a sync worker to the central DB."""

    def __init__(self, parts: StoreParts, cache: LocalCache, worker: SyncWorker,
                 settings: Settings) -> None:
        self.parts = parts
        self.cache = cache
        self.worker = worker
        self._settings = settings

    @classmethod
    async def start(cls, parts: StoreParts, s: Settings, *, keep_clean: bool,
                    lock: CacheFileLock | None = None, new_writer_id: str | None = None
                    ) -> LocalFirstMode:
        """Open the local cache, load it into the table and start the sync worker.

        `keep_clean=False` (the cache turned on at run time): see `EntryTable.fill`. `lock`:
        the cache file's lock, held by direct mode; `new_writer_id`: the id a file created now
        gets (`LocalCache.open`). On an error nothing is left open and the table holds nothing.
        """
        cache = await LocalCache.open(
            s.resolved_cache_path,
            owner_id=parts.triggerer_id,
            local_sync="normal" if s.local_sync == "normal" else "full",
            memory_window=s.memory_window,
            lock=lock,
            new_writer_id=new_writer_id,
        )
        table = parts.table
        worker: SyncWorker | None = None
        try:
            entries = await cache.load()
            outbox = Outbox(cache, await cache.load_outbox())
            worker = SyncWorker(
                table=table, cache=cache, sink=parts.sink, policies=parts.policies,
                flush_interval=s.flush_interval, max_batch=s.max_batch,
                on_conflict=parts.on_conflict, claims=parts.claims,
                budget_rows_per_s=s.central_budget_rows_per_s, flush_timeout=s.flush_timeout,
                outbox=outbox,
            )
            table.fill(cache, entries, keep_clean=keep_clean, on_full=worker.kick,
                       pinned=worker.holds)
            worker.start()
        except BaseException:
            table.forget_all(purge=False)
            if worker is not None:
                await worker.stop(0)
            await cache.close()
            raise
        if table.dirty or len(outbox):
            log.info("%d writes and %d events not yet in the central DB found in %s; flushing",
                     len(table.dirty), len(outbox), cache.path)
            worker.kick()
        return cls(parts, cache, worker, s)

    async def stop(self, timeout: float) -> None:
        """Stop the sync worker after a last flush of up to `timeout` seconds."""
        await self.worker.stop(timeout)

    async def close(self) -> None:
        """Close the local cache (after `stop`): what is staged is committed first."""
        await self.cache.close()

    async def drain_and_stop(self, timeout: float) -> CacheFileLock:
        """Flush every dirty key, stop, empty the table and the file (the cache turned off);
        return the file's lock, still held (direct mode keeps it: the file's writer id stays
        this store's alone).

        Raises `CentralUnavailable` when the flush does not finish within `timeout`; then (or
        on any other error) the mode is left running, nothing lost or changed.
        """
        table = self.parts.table
        try:
            await asyncio.wait_for(self._drain(), timeout)
        except asyncio.TimeoutError:
            raise CentralUnavailable(
                f"could not flush {len(table.dirty)} dirty keys to {self.worker.sink.url} "
                f"within {timeout:g} s (close_timeout) to turn the cache off; it stays on"
            ) from None
        await self.worker.stop(timeout)  # nothing is dirty: this only ends its loop
        # The central DB holds every row now: empty the file, so that turning the cache on
        # again (or the next start) cannot serve a value written centrally meanwhile.
        table.forget_all(purge=True)
        await self.cache.close(keep_lock=True)
        return self.cache.lock

    async def _drain(self) -> None:
        while self.parts.table.dirty:
            await self.worker.flush()

    def retune(self, settings: Settings) -> None:
        self._settings = settings
        self.worker.retune(flush_interval=settings.flush_interval,
                           max_batch=settings.max_batch)

    def conflicted(self) -> Container[StateKey]:
        return self.worker.conflicted

    # -- reads -----------------------------------------------------------------------------

    async def read(self, k: StateKey) -> Entry | None:
        return await known_entry(self.parts.table, self.parts.reader, k)

    async def read_central(self, k: StateKey) -> CentralRow | None:
        """`k`'s central record, read now; a clean, older entry of this store takes it."""
        table = self.parts.table
        since = table.read_epoch(k[0])
        row = (await self.parts.sink.read_many([k])).get(k)
        if row is not None:
            table.adopt(k, row, since)  # not as a new key if an eviction ran meanwhile
        return row

    async def records(self, owner: str) -> list[Record]:
        snapshot = [(k, e) for k, e in self.parts.table.entries.items() if k[0] == owner]
        conflicted = self.worker.conflicted
        return [record_of(k, e, conflicted) for k, e in sorted(snapshot) if e.data is not None]

    async def load(self, owner: str) -> int:
        return await load_owner(self.parts.table, self.parts.sink, owner)

    # -- writes ----------------------------------------------------------------------------

    async def set(self, k: StateKey, data: str, obj: object, durability: Durability) -> int:
        check_key(k)  # before the policy lookup matches the owner against its patterns
        e = await first_write_base(self.parts.table, self.parts.reader, k, read=(
            set_reads_base(durability, self.parts.policies.for_owner(k[0]))))
        return await self._write(k, e, data, obj, durability)

    async def compare_and_set(self, k: StateKey, data: str, obj: object,
                              expected_version: int, durability: Durability) -> int:
        owner, key = k
        check_key(k)
        entries = self.parts.table.entries
        central = durability == "central"
        for attempt in range(_CAS_ROUNDS):
            e = await self._committed_base(k, durability)
            if e.synced_version == UNKNOWN_BASE and entries.get(k) is not e:
                raise CentralUnavailable(
                    f"cannot compare {owner}/{key} with version {expected_version}: this store "
                    "does not hold it and the central DB could not be read; nothing was written"
                )
            actual = e.version if e.data is not None else 0
            if actual != expected_version and central:
                # this store's entry may be behind another store's commit: compare with the
                # central record before refusing (a query on the refusal path only)
                await self.read_central(k)
                e = await self._committed_base(k, durability)
                actual = e.version if e.data is not None else 0
            if actual != expected_version:
                raise VersionConflict(
                    f"{owner}/{key} is at version {actual}, not {expected_version}",
                    expected=expected_version, actual=actual,
                )
            try:
                return await self._write(k, e, data, obj, durability)
            except WriteRejected:
                # The flush met a commit this store had not seen: the entry holds that commit
                # and the refused write never took effect. The comparison is with the
                # committed record, so it is made again (a key another store deleted has no
                # value for expected_version 0, whatever its tombstone's version).
                if attempt == _CAS_ROUNDS - 1:
                    raise
        raise AssertionError("unreachable")  # the last round returns or raises

    async def delete(self, k: StateKey, durability: Durability) -> bool:
        check_key(k)
        e = await self._committed_base(k, durability)
        if e.data is None and e.synced_version != UNKNOWN_BASE and durability == "central":
            await self.read_central(k)  # another store may have written it since
            e = await self._committed_base(k, durability)
        if e.data is None and e.synced_version != UNKNOWN_BASE:
            return False  # known to have no value (a base of UNKNOWN_BASE: it may have one)
        await self._write(k, e, None, None, durability)
        return True

    async def _committed_base(self, k: StateKey, durability: Durability) -> Entry:
        """The entry a conditional write (compare-and-set, delete) decides on.

        In ``central`` durability, the committed one: while this store still owes the central
        DB a write of `k` (its own, pending), wait until the flush has settled it (written, or
        replaced by the central record), so the decision is made on what the central DB holds
        as far as this store can know, never on a write that may yet be refused. Other writers'
        later commits are caught by the fence of this write's own flush. In ``local`` and
        ``memory`` durability, this store's own view, pending writes included. A refusal in
        ``central`` durability is checked against the central record first (`read_central`).
        """
        table, reader = self.parts.table, self.parts.reader
        e = await first_write_base(table, reader, k)
        if durability != "central":
            return e
        while e.dirty and table.entries.get(k) is e:  # a new entry owes nothing yet
            # a write that lost to the central record: the entry holds that record now
            with contextlib.suppress(WriteRejected):
                await self.worker.wait_flushed(k, e.version, self._settings.central_timeout)
            e = await first_write_base(table, reader, k)
        return e

    async def _write(self, k: StateKey, e: Entry, data: str | None, obj: object,
                     durability: Durability) -> int:
        """A write off the hot path: `e` is `k`'s entry, or the new one it is based on."""
        version = self.parts.table.write_first(k, e, data, obj, durability == "memory")
        return await self.persist(k, e, version, durability)

    async def persist(self, k: StateKey, e: Entry, version: int, durability: Durability
                      ) -> int:
        """Wait until the write `version` of `k` holds at `durability`."""
        if durability == "memory":
            return version  # staged by EntryTable.write
        if durability != "central":
            await self.cache.commit(k, e)
            return version
        # The central waiter is registered before the local commit is awaited: a flush
        # running meanwhile can carry this version, and it settles only the waiters that
        # exist when it marks the key clean.
        worker = self.worker
        fut = worker.expect_flush(k, version)
        try:
            await self.cache.commit(k, e)
        except BaseException:
            worker.drop_waiter(k, fut)
            if fut.done() and not fut.cancelled():
                fut.exception()  # settled meanwhile: the commit's error is the one to raise
            raise
        await worker.wait_flushed(k, version, self._settings.central_timeout, fut)
        return version

    # -- flushing --------------------------------------------------------------------------

    async def flush(self) -> FlushReport:
        return await self.worker.flush()

    async def sync_local(self) -> None:
        await self.cache.sync_now()

    def unflushed(self, keys: Iterable[StateKey] | None = None) -> list[Unflushed]:
        """The keys (of `keys`, if given) whose entry is dirty, or whose last flush lost a
        conflict, in key order."""
        table, conflicted = self.parts.table, self.worker.conflicted
        candidates = {*table.dirty, *conflicted} if keys is None else set(keys)
        out: list[Unflushed] = []
        for k in sorted(candidates):
            e = table.entries.get(k)
            if e is None:
                continue
            if e.dirty:
                out.append((k, e, FlushState.DIRTY))
            elif k in conflicted:
                out.append((k, e, FlushState.CONFLICT))
        return out


# -- the central reads of keys not in memory ------------------------------------------------


async def load_owner(table: EntryTable, sink: Sink, owner: str) -> int:
    """Adopt `owner`'s central rows (none lowers an entry); return how many have a value."""
    since = table.read_epoch(owner)
    rows = await sink.read_owner(owner)
    for row in rows:  # a key dropped during the read is left to be read through
        table.adopt((row.owner, row.key), row, since)
    return sum(1 for r in rows if r.data is not None)


async def known_entry(table: EntryTable, reader: ReadThrough, k: StateKey) -> Entry | None:
    """The entry of `k`, reading through to the central DB on a miss."""
    try:
        e = table.entries.get(k)
    except TypeError:
        refuse_unhashable_names(*k)
    if e is not None:
        e.used = True
        return e
    check_name("owner", k[0])
    check_name("key", k[1])
    while True:  # again when a drop made the row read possibly stale
        if table.is_absent(k):
            return None
        since = table.read_epoch(k[0])
        row = await reader.fetch(k)
        e = table.entries.get(k)  # written meanwhile by a call of this store
        if row is not None:
            e = table.adopt(k, row, since)
            if e is not None:
                return e
        elif e is not None or table.mark_absent(k, since):
            return e


def set_reads_base(durability: Durability, policy: ConflictPolicy) -> bool:
    """Whether a `set` of a key this store does not hold reads its central record first.

    Only when the answer matters before the flush: a ``central`` write waits for the flush
    anyway, and under ``reject`` a write on an unknown base could only lose to an existing
    record. Any other ``local``/``memory`` set is based on "not yet known" (`UNKNOWN_BASE`)
    and never waits for the central DB; its flush settles it by the policy (``max`` compares
    the values, ``last_writer_wins`` the times, a row of this writer's own chain is replaced).
    """
    return durability == "central" or policy.name == "reject"


async def first_write_base(table: EntryTable, reader: ReadThrough, k: StateKey, *,
                           read: bool = True) -> Entry:
    """The entry a first write of `k` is based on: its central record, read now.

    When the central DB cannot be read, or `read` is False (see `set_reads_base`), the entry
    is based on "unknown" (`UNKNOWN_BASE`; on "none" while `k` is known to be absent); the
    caller decides whether the write may go ahead (a set may, a compare-and-set may not).
    Synchronous from the end of the read to the return: the caller writes before any await.
    """
    check_name("owner", k[0])
    check_name("key", k[1])
    if not read:  # no await: the caller writes in the same step
        return table.first_write_base(k, None, unknown=not table.is_absent(k))
    row: CentralRow | None = None
    unknown = False
    while k not in table.entries and not table.is_absent(k):
        since = table.read_epoch(k[0])
        try:
            row = await reader.fetch(k)
        except CentralError as exc:
            unknown = True
            # the reader's FailureLog tells of the outage; this key's fallback is detail
            log.debug("cannot read %s/%s from the central DB before writing it (%s); the "
                        "write is based on an unknown central version and settled by the "
                        "conflict policy at the flush", k[0], k[1], exc)
            break
        if since == table.read_epoch(k[0]):
            break
        row = None  # an entry was dropped during the read: `k` at a newer version, maybe
    return table.first_write_base(k, row, unknown=unknown)
