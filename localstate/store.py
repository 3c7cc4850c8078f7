"""`StateStore`: the public store. Local-first get/set in front of the sync worker.

The hot path is a dict: `get` of a known key and `set` in ``memory`` durability touch nothing
but memory; ``local`` waits for the group commit that carries the write; ``central`` waits for
the flush that puts it in the central DB. With the cache turned off (``enabled=False``) every
call goes straight to the central DB, one transaction per `set`, as Airflow's own
``Variable.set`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import warnings
from collections.abc import AsyncIterator, Callable, Container, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from localstate.central_reads import first_write_base, known_entry, load_owner, set_reads_base
from localstate.claims import ClaimBook
from localstate.codec import IMMUTABLE_TYPES, decode, encode
from localstate.config import Settings
from localstate.entry import (
    NOT_DECODED,
    UNKNOWN_BASE,
    Entry,
    StateKey,
    entry_from_row,
    record_of,
)
from localstate.entry_table import EntryTable
from localstate.errors import (
    CentralUnavailable,
    ConfigError,
    InvalidInput,
    LocalStateError,
    StoreClosed,
    VersionConflict,
    WriteRejected,
)
from localstate.local_cache import LocalCache
from localstate.metrics import MetricsReporter
from localstate.mode_gate import ModeGate
from localstate.mode_switch import apply_live_settings
from localstate.model import (
    Durability,
    FlushState,
    Record,
    check_durability,
    check_name,
    refuse_unhashable_names,
)
from localstate.release import ReleaseReport, release_owner
from localstate.stats import StoreStats, store_stats
from localstate.store_parts import open_parts, release, require_open
from localstate.sync.central_store import CentralStore
from localstate.sync.conflicts import PolicyMap
from localstate.sync.read_through import ReadThrough
from localstate.sync.rows import CentralRow
from localstate.sync.sink_thread import ThreadedSink
from localstate.sync.sinks import ClaimingSink, Sink
from localstate.sync.worker import ConflictInfo, FlushReport, SyncWorker

if TYPE_CHECKING:
    from localstate.reload import ConfigWatcher
    from localstate.variable import StateVariable

__all__ = ["StateStore"]

log = logging.getLogger(__name__)
#: rounds a central-durability compare-and-set makes when its flush meets an unseen commit
_CAS_ROUNDS = 3
_now = time.time


class StateStore:
    """A local-first state store. ``store = await StateStore.open(...)`` or ``async with``.

    Every option may also come from the environment or ``airflow.cfg`` (see
    `localstate.config`); explicit arguments win.
    """

    def __init__(
        self,
        *,
        cache_path: str | Path | None = None,
        central_url: str | None = None,
        triggerer_id: str | None = None,
        durability: Durability | None = None,
        enabled: bool | None = None,
        flush_interval: float | None = None,
        max_batch: int | None = None,
        conflict_policy: str | Mapping[str, str] | None = None,
        max_value_bytes: int | None = None,
        settings: Settings | None = None,
        sink: Sink | str | None = None,
        on_conflict: Callable[[ConflictInfo], None] | None = None,
        **options: Any,
    ) -> None:
        if isinstance(sink, str):  # the `sink` setting ("sql" | "airflow"), not a Sink
            options["sink"], sink = sink, None
        explicit = dict(
            cache_path=cache_path, central_url=central_url, triggerer_id=triggerer_id,
            durability=durability, enabled=enabled, flush_interval=flush_interval,
            max_batch=max_batch, conflict_policy=conflict_policy,
            max_value_bytes=max_value_bytes, **options,
        )
        given = {k: v for k, v in explicit.items() if v is not None}
        if settings is None:
            settings = Settings.resolve(given)
        elif given:
            settings = settings.replace(**given)
        self.settings = settings
        self.triggerer_id = settings.resolved_triggerer_id
        self._durability: Durability = settings.durability
        self._max_value_bytes = settings.max_value_bytes
        self._direct = not settings.enabled
        self._policies = PolicyMap(settings.conflict_policy)
        self._on_conflict = on_conflict
        #: the claim epochs this store holds, and the owners it lost (see `claim`)
        self._claims = ClaimBook()
        self._sink: Sink | None = sink
        self._owns_sink = sink is None
        self._cache: LocalCache | None = None
        self._worker: SyncWorker | None = None
        self._reader: ReadThrough | None = None
        #: the one owner of the entries, dirty keys and absent keys (see EntryTable)
        self._table = EntryTable(updated_by=self.triggerer_id, kick_at=settings.max_batch,
                                 absent_ttl=settings.absent_ttl,
                                 max_keys=settings.max_keys_in_memory)
        # The table's map, read by the hot path without a call; never changed here. The same
        # dict for the store's lifetime (the table fills and empties it in place).
        self._entries = self._table.entries
        # the hot path's one call, bound once (a lookup less per set than self._table.write)
        self._write_entry = self._table.write
        # read by api/view.py (through getattr) until it asks `unflushed()`
        self._dirty = self._table.dirty
        self._opened = False
        self._closed = False
        self._hits = 0  # gets served from memory
        self._misses = 0  # gets that had to look further
        self._metrics: MetricsReporter | None = None  # off unless statsd_host / otel is set
        # switches between local-first and direct mode under running calls (reconfigure)
        self._gate = ModeGate()
        self._reconfiguring = asyncio.Lock()
        self._watcher: ConfigWatcher | None = None  # with watch_config

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, **kwargs: Any) -> StateStore:
        store = cls(**kwargs)
        await open_parts(store)
        return store

    async def __aenter__(self) -> StateStore:
        await open_parts(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush what can be flushed within ``close_timeout``, then close. Safe twice."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        if self._watcher is not None:
            await self._watcher.stop()
        async with self._gate.exclusive():  # a mode switch in progress finishes first
            if self._worker is not None:
                await self._worker.stop(self.settings.close_timeout)
            if self._metrics is not None:
                await self._metrics.stop()  # the last report: what the final flush did
            await release(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def config_watcher(self) -> ConfigWatcher | None:
        """The watcher of airflow.cfg (with ``watch_config``), else None."""
        return self._watcher

    @property
    def central_store(self) -> CentralStore | None:
        """The SQL central store behind this store (None when another sink is used)."""
        sink = self._sink.inner if isinstance(self._sink, ThreadedSink) else self._sink
        return sink if isinstance(sink, CentralStore) else None

    @property
    def sync_worker(self) -> SyncWorker | None:
        """The sync worker (None with the cache off): its named flush steps, for tests."""
        return self._worker

    @property
    def entry_table(self) -> EntryTable:
        """The owner of this store's entries (read it; its operations are the store's)."""
        return self._table

    def __del__(self, _warn: Any = warnings.warn) -> None:
        # a constructor that raised leaves an object without these: it was never opened
        if getattr(self, "_opened", False) and not getattr(self, "_closed", True):
            _warn(f"StateStore {self.triggerer_id!r} was never closed", ResourceWarning,
                  stacklevel=1)

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(
            "this StateStore is closed; open a new one with `await StateStore.open(...)`"
        )

    # -- reading -------------------------------------------------------------------------

    async def get(self, owner: str, key: str, default: Any = None) -> Any:
        """The value of ``(owner, key)``, or `default` when it has none."""
        if self._closed:
            raise self._closed_error()
        try:
            e = self._entries.get((owner, key))
        except TypeError:  # an unhashable owner or key (a list, say): no name at all
            refuse_unhashable_names(owner, key)
        if e is not None:
            self._hits += 1
            e.used = True  # its second chance at the next eviction pass
            data = e.data
            if data is None:
                return default
            obj = e.obj
            return obj if obj is not NOT_DECODED else decode(data)
        self._misses += 1
        async with self._gate.call():
            e = await self._read((owner, key))
        if e is None or e.data is None:
            return default
        return e.obj if e.obj is not NOT_DECODED else decode(e.data)

    async def get_many(self, owner: str, keys: Iterable[str]) -> dict[str, Any]:
        """The values of the keys of `owner` that have one (missing keys are left out)."""
        if self._closed:
            raise self._closed_error()
        keys = list(keys)
        async with self._gate.call():
            found = await asyncio.gather(*(self._read((owner, k)) for k in keys))
        return {
            k: (e.obj if e.obj is not NOT_DECODED else decode(e.data))
            for k, e in zip(keys, found, strict=True)
            if e is not None and e.data is not None
        }

    async def record(self, owner: str, key: str) -> Record | None:
        """The full record (value, version, stamps, flush state), or None."""
        if self._closed:
            raise self._closed_error()
        async with self._gate.call():
            e = await self._read((owner, key))
            if e is None or e.data is None:
                return None
            return record_of((owner, key), e, self._conflicted())

    async def read_committed(self, owner: str, key: str) -> Record | None:
        """The record the central DB holds now (None: no value), read with a query of its own.

        Linearizable with every write acknowledged centrally (``central`` durability, a
        compare-and-set in ``central`` durability, any write in direct mode): a call that starts
        after such a write returned sees it or a later one. Writes this store still owes the
        central DB are not shown. The row also refreshes this store's entry when the entry is
        clean and older (it never lowers an entry).
        """
        if self._closed:
            raise self._closed_error()
        k = (owner, key)
        try:
            hash(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(owner, key)
        check_name("owner", owner)
        check_name("key", key)
        async with self._gate.call():
            row = await self._read_central(k)
            if row is None or row.data is None:
                return None
            return record_of(k, entry_from_row(row), ())

    async def _read_central(self, k: StateKey) -> CentralRow | None:
        """`k`'s central record, read now with a query of its own (not through the
        read-through: joining a read already in flight could return a row read before this
        call began); a clean, older entry of this store takes it."""
        since = self._table.read_epoch(k[0])
        row = (await self._require_sink().read_many([k])).get(k)
        if row is not None and not self._direct:
            self._table.adopt(k, row, since)  # not as a new key if an eviction ran meanwhile
        return row

    async def items(self, owner: str) -> AsyncIterator[Record]:
        """The records of `owner` this store holds (call `load(owner)` first to refresh)."""
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():  # not held while the caller iterates
            if self._direct:
                rows = await self._require_sink().read_owner(owner)
                conflicted = self._conflicted()
                records = [record_of((r.owner, r.key), entry_from_row(r), conflicted)
                           for r in rows if r.data is not None]
            else:
                snapshot = [(k, e) for k, e in self._entries.items() if k[0] == owner]
                conflicted = self._conflicted()
                records = [record_of(k, e, conflicted)
                           for k, e in sorted(snapshot) if e.data is not None]
        for record in records:
            yield record

    async def load(self, owner: str) -> int:
        """Refresh `owner`'s keys from the central DB in one query; return how many it has.

        Call it when this process takes over an owner (a trigger moved here): clean entries
        take the central records that are newer, dirty ones are left for the flush to
        reconcile. No entry ever goes back to an older version.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():
            if self._direct:
                rows = await self._require_sink().read_owner(owner)
                return sum(1 for r in rows if r.data is not None)
            return await load_owner(self._table, self._require_sink(), owner)

    async def _read(self, k: StateKey) -> Entry | None:
        """The entry of `k` in the mode in force (inside the gate): memory, else central."""
        if not self._direct:
            return await known_entry(self._table, self._require_reader(), k)
        try:
            hash(k)
        except TypeError:
            refuse_unhashable_names(*k)
        check_name("owner", k[0])
        check_name("key", k[1])
        row = (await self._require_sink().read_many([k])).get(k)
        return None if row is None else entry_from_row(row)

    # -- writing -------------------------------------------------------------------------

    async def set(
        self, owner: str, key: str, value: Any, *, durability: Durability | None = None
    ) -> int:
        """Set ``(owner, key)`` to `value`; return the new version once `durability` holds."""
        if self._closed:
            raise self._closed_error()
        if self._claims.lost:  # another writer claimed an owner from this store
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._policies.checks_values:  # some owner's max policy declares an order
            self._policies.check_value(owner, value, data)
        if durability is None:
            durability = self._durability
        elif durability != "memory" and durability != "local" and durability != "central":
            check_durability(durability)  # raises, before anything is written
        k = (owner, key)
        try:
            e = None if self._direct else self._entries.get(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(owner, key)
        if e is None:
            return await self._set_slow(k, data, value, durability)
        # the hot path: one call into the table, which makes the write in memory (inline there)
        version = self._write_entry(
            k, e, data, value if type(value) in IMMUTABLE_TYPES else NOT_DECODED,
            durability == "memory",
        )
        if durability == "memory":
            return version
        return await self._persist(k, e, version, durability)

    async def _set_slow(self, k: StateKey, data: str, value: Any, durability: Durability
                        ) -> int:
        """`set` in direct mode, or of a key not in memory: in one mode from start to end."""
        async with self._gate.call():
            if self._direct:
                return await self._set_direct(k, data, durability)
            e = await first_write_base(self._table, self._require_reader(), k, read=(
                set_reads_base(durability, self._policies.for_owner(k[0]))))
            return await self._write(
                k, e, data, value if type(value) in IMMUTABLE_TYPES else NOT_DECODED, durability
            )

    async def compare_and_set(
        self, owner: str, key: str, value: Any, *, expected_version: int,
        durability: Durability | None = None,
    ) -> int:
        """Set only if the record is at `expected_version` (0: it must not exist).

        Raises `VersionConflict` otherwise. Across processes the check is as strong as the
        flush's fencing: a write based on a stale central version is a conflict there too.
        """
        if self._closed:
            raise self._closed_error()
        if isinstance(expected_version, bool) or not isinstance(expected_version, int):
            raise InvalidInput(f"expected_version must be an int, not {expected_version!r}")
        if self._claims.lost:
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._policies.checks_values:  # some owner's max policy declares an order
            self._policies.check_value(owner, value, data)
        async with self._gate.call():
            return await self._compare_and_set((owner, key), value, data, expected_version,
                                               durability)

    async def _compare_and_set(self, k: StateKey, value: Any, data: str, expected_version: int,
                               durability: Durability | None) -> int:
        owner, key = k
        if self._direct:  # one conditional statement on the central DB
            self._count_direct_write(k, durability)
            row = await self._require_sink().write_if_version(
                owner, key, data, expected_version, updated_by=self.triggerer_id,
                updated_at=_now())
            return row.version
        try:
            hash(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(*k)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
        for attempt in range(_CAS_ROUNDS):
            e = await self._committed_base(k, durability)
            if e.synced_version == UNKNOWN_BASE and self._entries.get(k) is not e:
                raise CentralUnavailable(
                    f"cannot compare {owner}/{key} with version {expected_version}: this store "
                    "does not hold it and the central DB could not be read; nothing was written"
                )
            actual = e.version if e.data is not None else 0
            if actual != expected_version and self._decides_on_central(durability):
                # this store's entry may be behind another store's commit: compare with the
                # central record before refusing (a query on the refusal path only)
                await self._read_central(k)
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
                # Its flush met a commit this store had not seen (the entry holds it now, and
                # the refused write never took effect). The comparison is with the committed
                # record, so make it again: a key another store deleted still has no value
                # for expected_version 0, whatever the tombstone's version.
                if attempt == _CAS_ROUNDS - 1:
                    raise
        raise AssertionError("unreachable")  # the last round returns or raises

    async def delete(
        self, owner: str, key: str, *, durability: Durability | None = None
    ) -> bool:
        """Delete ``(owner, key)``; return whether it had a value.

        False only when the store knows the key had no value. When it cannot know (the key is
        not in memory and the central DB cannot be read) the delete is recorded all the same
        (based on an unknown version, applied when the DB answers) and the answer is True.
        """
        if self._closed:
            raise self._closed_error()
        if self._claims.lost:
            self._claims.check(owner)
        async with self._gate.call():
            return await self._delete((owner, key), durability)

    async def _delete(self, k: StateKey, durability: Durability | None) -> bool:
        if self._direct:  # a compare-and-delete on the central DB
            self._count_direct_write(k, durability)
            return await self._require_sink().delete_current(
                k[0], k[1], updated_by=self.triggerer_id)
        try:
            hash(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(*k)
        e = await self._committed_base(k, durability)
        if e.data is None and e.synced_version != UNKNOWN_BASE and self._decides_on_central(
                durability):
            await self._read_central(k)  # another store may have written it since
            e = await self._committed_base(k, durability)
        if e.data is None and e.synced_version != UNKNOWN_BASE:
            return False  # known to have no value (a base of UNKNOWN_BASE: it may have one)
        await self._write(k, e, None, None, durability)
        return True

    def _decides_on_central(self, durability: Durability | None) -> bool:
        """Whether a conditional write in `durability` decides on the central record."""
        return (durability or self._durability) == "central"

    async def _committed_base(self, k: StateKey, durability: Durability | None) -> Entry:
        """The entry a conditional write (compare-and-set, delete) decides on.

        In ``central`` durability, the committed one: while this store still owes the central
        DB a write of `k` (its own, pending), wait until the flush has settled it (written, or
        replaced by the central record), so the decision is made on what the central DB holds
        as far as this store can know, never on a write that may yet be refused. Other writers'
        later commits are caught by the fence of this write's own flush. In ``local`` and
        ``memory`` durability, this store's own view, pending writes included. A refusal in
        ``central`` durability is checked against the central record first (`_read_central`).
        """
        e = await first_write_base(self._table, self._require_reader(), k)
        if not self._decides_on_central(durability):
            return e
        worker = self._require_worker()
        while e.dirty and self._entries.get(k) is e:  # a new entry owes nothing yet
            # a write that lost to the central record: the entry holds that record now
            with contextlib.suppress(WriteRejected):
                await worker.wait_flushed(k, e.version, self.settings.central_timeout)
            e = await first_write_base(self._table, self._require_reader(), k)
        return e

    async def _persist(
        self, k: StateKey, e: Entry, version: int, durability: Durability
    ) -> int:
        """Wait until the write `version` of `k` holds at `durability`."""
        if durability == "memory":
            return version  # staged by EntryTable.write
        if durability != "central":
            await self._require_cache().commit(k, e)
            return version
        # The central waiter is registered before the local commit is awaited: a flush
        # running meanwhile can carry this version, and it settles only the waiters that
        # exist when it marks the key clean.
        worker = self._require_worker()
        fut = worker.expect_flush(k, version)
        try:
            await self._require_cache().commit(k, e)
        except BaseException:
            worker.drop_waiter(k, fut)
            if fut.done() and not fut.cancelled():
                fut.exception()  # settled meanwhile: the commit's error is the one to raise
            raise
        await worker.wait_flushed(k, version, self.settings.central_timeout, fut)
        return version

    async def _write(
        self, k: StateKey, e: Entry, data: str | None, obj: Any,
        durability: Durability | None,
    ) -> int:
        """A write off the hot path: `e` is `k`'s entry, or the new one it is based on."""
        mode = self._durability if durability is None else check_durability(durability)
        version = self._table.write_first(k, e, data, obj, mode == "memory")
        return await self._persist(k, e, version, mode)

    def _count_direct_write(self, k: StateKey, durability: Durability | None) -> None:
        """Check a direct write's names and durability (nothing in memory checks them here)."""
        check_name("owner", k[0])
        check_name("key", k[1])
        if durability is not None:
            check_durability(durability)
        self._table.count_direct_write()

    async def _set_direct(
        self, k: StateKey, data: str | None, durability: Durability | None
    ) -> int:
        self._count_direct_write(k, durability)
        row = await self._require_sink().write_direct(
            k[0], k[1], data, updated_at=time.time(), updated_by=self.triggerer_id
        )
        return row.version

    # -- claims --------------------------------------------------------------------------

    @property
    def can_claim(self) -> bool:
        """Whether this store's sink keeps claim epochs (the ``sql`` sink does; Airflow's
        state store, the ``airflow`` sink, does not)."""
        return isinstance(self._sink, ClaimingSink)

    async def claim(self, owner: str) -> int:
        """Take `owner` over for this store: bump its claim epoch in the central DB (recording
        this store's ``triggerer_id``), then refresh its keys from there; return the epoch.

        From then on the central DB refuses any flushed write of `owner` from a store that
        holds a lower epoch (a zombie: a triggerer the trigger was moved away from), whatever
        the conflict policy; that store raises `OwnerLost` for its later writes of `owner`.
        Writes this store made before the claim are flushed first, under the claim they were
        made in. Within one claim the conflict policies apply as before.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        sink = self._require_sink()
        if not isinstance(sink, ClaimingSink):
            raise ConfigError(
                f"the sink {sink.url} keeps no claim epochs (sink = airflow): owners cannot be "
                "claimed, so a zombie triggerer is not fenced; use sink = sql")
        async with self._gate.call():
            since = self._claims.begin()
            if self._worker is not None and any(k[0] == owner for k in self._table.dirty):
                await self._worker.flush()
            epoch = await sink.claim(
                owner, claimant=self.triggerer_id,
                writer=self._cache.writer_id if self._cache is not None else None)
            self._claims.took(owner, epoch, since)
            if not self._direct:
                await load_owner(self._table, sink, owner)
        return epoch

    def claim_epoch(self, owner: str) -> int:
        """The claim epoch this store holds on `owner` (0: none)."""
        return self._claims.epoch_of(owner)

    @property
    def claims_refused(self) -> int:
        """Flushed writes the central DB refused for their claim epoch."""
        return self._claims.refused

    # -- flushing and figures ------------------------------------------------------------

    async def flush(self) -> FlushReport:
        """Flush every dirty key now (waits for a flush in flight first); report what it did."""
        if self._closed:
            raise self._closed_error()
        async with self._gate.call():
            if self._worker is None:
                return FlushReport()
            return await self._worker.flush()

    async def release(self, owner: str, *, timeout: float | None = None) -> ReleaseReport:
        """`owner` left this store: flush its writes, then drop its entries from memory and
        from the cache file once the central DB holds them (see `localstate.release`).

        Waits up to `timeout` seconds (default ``central_timeout``) for the flush; what the
        central DB does not hold by then stays, and is flushed as usual.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():
            if self._worker is None:  # the cache is off: nothing is held
                return ReleaseReport()
            wait = self.settings.central_timeout if timeout is None else timeout
            return await release_owner(self._table, self._worker, owner, wait)

    # -- settings at run time ------------------------------------------------------------

    async def reconfigure(self, settings: Settings) -> tuple[str, ...]:
        """Apply the live settings of `settings` to the running store; return those changed.

        Live: ``enabled``, ``flush_interval``, ``max_batch``, ``durability`` (see
        `LIVE_SETTINGS`); a change of any other setting is logged and applies at the next
        start. Turning the cache off holds new calls back, flushes every dirty key, then
        closes the local cache and sends every call to the central DB (no write is lost or
        overtaken: a call in progress finishes first). If that flush fails, the cache stays on
        and the error is raised. Turning it on opens the local cache and starts the sync worker.
        """
        if self._closed:
            raise self._closed_error()
        if not self._opened:
            raise LocalStateError("open the store before reconfiguring it")
        async with self._reconfiguring:  # one at a time: each compares with the one before
            return await apply_live_settings(self, settings)

    def stats(self) -> StoreStats:
        return store_stats(
            table=self._table, worker=self._worker, cache=self._cache, sink=self._sink,
            reader=self._reader, hits=self._hits, misses=self._misses,
            cache_enabled=not self._direct,
            config_error=self._watcher.last_error if self._watcher is not None else None,
        )

    def unflushed(self) -> list[tuple[StateKey, Entry, FlushState]]:
        """The keys whose entry is dirty, or whose last flush lost a conflict, in key order.

        A snapshot (the entries are the store's own: read them, do not change them).
        """
        table = self._table
        conflicted = self._worker.conflicted if self._worker is not None else set()
        out: list[tuple[StateKey, Entry, FlushState]] = []
        for k in sorted({*table.dirty, *conflicted}):
            e = table.entries.get(k)
            if e is None:
                continue
            if e.dirty:
                out.append((k, e, FlushState.DIRTY))
            elif k in conflicted:
                out.append((k, e, FlushState.CONFLICT))
        return out

    async def sync_local(self) -> None:
        """Wait until every write made so far is committed to the local cache file."""
        if self._cache is not None:
            await self._cache.sync_now()

    def variable(self, key: str, *, owner: str) -> StateVariable:
        """A handle on one state variable: ``await sv.get()``, ``await sv.set(v)``."""
        from localstate.variable import StateVariable

        return StateVariable(key, owner=owner, store=self)

    # -- helpers -------------------------------------------------------------------------

    def _conflicted(self) -> Container[StateKey]:
        """The keys whose last flush lost a conflict (none without a sync worker)."""
        w = self._worker
        return w.conflicted if w is not None else frozenset()

    def _require_sink(self) -> Sink:
        return require_open(self._sink)

    def _require_reader(self) -> ReadThrough:
        return require_open(self._reader)

    def _require_worker(self) -> SyncWorker:
        return require_open(self._worker)

    def _require_cache(self) -> LocalCache:
        return require_open(self._cache)
