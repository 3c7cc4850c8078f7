"""`StateStore`: the public store. Local-first get/set in front of the sync worker.

The hot path is a dict: `get` of a known key and `set` in ``memory`` durability touch nothing
but memory; ``local`` waits for the group commit that carries the write; ``central`` waits for
the flush that puts it in the central DB. With the cache turned off (``enabled=False``) every
call goes straight to the central DB, one transaction per `set`, as Airflow's own
``Variable.set`` does.

Why one file of this length: `StateStore` is one object, and its calls, its life from open to
close and its live toggle read and change the same state (below). Kept apart, each piece would
read the others' private attributes; kept here, each attribute has its one owner in view. The
parts it holds that are objects of their own, with their own state behind public methods, live
in their own files: the modes (`localstate._modes`: `DirectMode` and the `StoreParts` both modes
share; `localstate._local_first`: `LocalFirstMode`, the cache file and sync worker and the
central reads of keys not in memory), the `ModeGate` (`localstate._mode_gate`), a pending
turn-off (`localstate._pending_switch`), the config watcher (`localstate._core.reload`) and the
process's default-store slot (`localstate._default_store`). `StateVariable`, the handle on one
variable and the class-level calls on the process's default store, is here too: a store makes
handles (`variable`) and the class-level calls open a store, so the two are one unit (as
`BlockingStateStore` and its `StateVariable` are in `localstate.blocking`).

What a `StateStore` owns, and alone replaces:

* the settings in force (`settings`), replaced only by `reconfigure`;
* the mode in force (`LocalFirstMode` or `DirectMode`), replaced only under the `ModeGate`'s
  switch (`reconfigure` through `_turned_on`, and a turn-off's `_finish_turn_off` through
  `_turned_off`), and ``_hot``, the map a `set` may write without the gate (the table's
  entries; empty while the cache turns off);
* the turn-off waiting for the central DB to take the cache's backlog (`PendingTurnOff`, None
  when none is), started by `reconfigure` or `open` and cancelled by `reconfigure` or `close`;
* the parts both modes share (`StoreParts`: sink, read-through, table), from open to close;
* the config watcher and metrics reporter it starts at open and stops at close, and the
  get counters its figures (`stats`) report.

The entries, dirty keys and absent keys belong to the `EntryTable` it makes; the claim epochs to
its `ClaimBook`.

Releasing an owner (`release`), invariants:

* Nothing acknowledged is lost: an entry is dropped only when the central DB holds exactly
  its version (clean), and never while the sync worker still needs it (a central waiter, a
  conflict whose flush state is still to be read). A write made while the release waits is
  either carried by the flush it waits for (then the central DB holds it) or leaves its
  entry dirty (then it stays, is flushed as usual, and is evicted later like any clean entry).
* The decision to drop is taken synchronously after the waits, with no await in between:
  no write can slip between the check and the drop.
* A read of the owner's keys that began before the drop (a read-through, a load) may return
  a row older than what was dropped: the table's read epoch makes that reader read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from localstate._cache.entry import NOT_DECODED, Entry, StateKey, entry_from_row, record_of
from localstate._cache.entry_table import EntryTable
from localstate._cache.local_cache import LocalCache
from localstate._cache.outbox import OwnerEvents
from localstate._core.class_or_instance import ClassOrInstance
from localstate._core.codec import IMMUTABLE_TYPES, decode, encode
from localstate._core.config import Settings, config_file_path
from localstate._core.conflicts import PolicyMap
from localstate._core.model import (
    Durability,
    Record,
    asset_name,
    check_durability,
    check_key,
    check_name,
    refuse_unhashable_names,
)
from localstate._core.protocol import ASSET_STATE_SOURCE
from localstate._core.reload import ConfigWatcher
from localstate._core.setting_specs import LIVE_SETTINGS, SETTING_NAMES
from localstate._core.source_figures import SourceFigures
from localstate._default_store import DefaultStore
from localstate._local_first import LocalFirstMode
from localstate._metrics import MetricsReporter, start_reporter
from localstate._mode_gate import ModeGate
from localstate._modes import DirectMode, Mode, NotOpen, StoreParts, Unflushed
from localstate._pending_switch import PendingTurnOff
from localstate._stats import StoreStats, store_stats
from localstate._sync.central.asset_events import NO_ASSET_EVENTS
from localstate._sync.central.asset_mirror import AssetMirror
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.history import HistoryPolicy
from localstate._sync.flush.claims import ClaimBook, claim_owner, claiming_sink
from localstate._sync.flush.settle import ConflictInfo, FlushReport
from localstate._sync.flush.worker import SyncWorker
from localstate._sync.sinks.airflow_sink import process_sink
from localstate._sync.sinks.read_through import ReadThrough
from localstate._sync.sinks.sink import ClaimingSink, ReleaseRecording, Sink, carries_events
from localstate._sync.sinks.sink_thread import ThreadedSink
from localstate.errors import (
    CacheLocked,
    CentralUnavailable,
    EventsUnsupported,
    InvalidInput,
    LocalStateError,
    OwnerLost,
    StoreClosed,
    reason,
)

__all__ = ["DEFAULT", "WATERMARK_KEY", "ReleaseReport", "StateStore", "StateVariable",
           "event_key", "process_store"]

# the store's logger: what the store and its modes log is the store's
log = logging.getLogger("localstate.store")

_Store = TypeVar("_Store", bound="StateStore")

#: the key a watermark is kept under by default (`StateEnabledTrigger.watermark_key`'s too)
WATERMARK_KEY = "watermark"


def event_key(watermark: Any) -> str:
    """The default idempotency key of an event emitted with `watermark`: the string itself,
    or the JSON text of any other value (``42`` -> ``"42"``, ``{"id": 7}`` -> ``'{"id":7}'``)."""
    return check_name("key", watermark if isinstance(watermark, str) else encode(watermark))


@dataclass(frozen=True)
class ReleaseReport:
    """What `StateStore.release` did."""

    #: entries dropped from memory and from the local cache file
    dropped: int = 0
    #: entries of the owner still held: written during the release, not flushed within the
    #: timeout (the central DB was down), or in conflict; flushed and evicted as usual
    kept: int = 0
    #: writes the release waited for the central DB to hold, and of those the ones it did not
    #: get within the timeout or that lost a conflict (kept, flushed later)
    flushed: int = 0
    unflushed: int = 0
    #: writes refused for good: another writer claimed the owner (`OwnerLost`), at this epoch
    refused: int = 0
    claimed_at_epoch: int | None = None
    #: the release is in the owner's history in the central DB (with the epoch this store
    #: held): False when this store held no claim of it, its sink keeps no history, or the
    #: central DB did not answer within the timeout
    recorded: bool = False


class StateStore:
    """A local-first state store. ``store = await StateStore.open(...)`` or ``async with``.

    Every option may also come from the environment or ``airflow.cfg`` (see
    `localstate.Settings`); explicit arguments win.

    What it owns, and how it opens, closes and is reconfigured: see the module docstring. Its
    calls read that state; a call not served from memory goes to the mode in force, inside the
    gate.
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
        self.settings = settings = Settings.with_arguments(settings, dict(
            cache_path=cache_path, central_url=central_url, triggerer_id=triggerer_id,
            durability=durability, enabled=enabled, flush_interval=flush_interval,
            max_batch=max_batch, conflict_policy=conflict_policy,
            max_value_bytes=max_value_bytes, **options,
        ))
        self.triggerer_id = settings.resolved_triggerer_id
        self._durability: Durability = settings.durability
        self._max_value_bytes = settings.max_value_bytes
        #: what the sources of this store's triggers report (queue watchers), for the metrics
        self.sources = SourceFigures()
        self._policies = PolicyMap(settings.conflict_policy)
        self._on_conflict = on_conflict
        #: the claim epochs this store holds, and the owners it lost (see `claim`)
        self._claims = ClaimBook()
        # Read by every write without a lookup through the book: the owners lost (the book's
        # dict, the same one for the store's lifetime, changed only by the book) and whether
        # some owner's policy declares an order (fixed: conflict_policy is not live).
        self._lost = self._claims.lost
        self._checks_values = self._policies.checks_values
        self._given_sink: Sink | None = sink
        #: the one owner of the entries, dirty keys and absent keys (see EntryTable)
        self._table = EntryTable(updated_by=self.triggerer_id, kick_at=settings.max_batch,
                                 absent_ttl=settings.absent_ttl,
                                 max_keys=settings.max_keys_in_memory)
        # The table's map, read by the hot path without a call; never changed here. The same
        # dict for the store's lifetime (the table fills and empties it in place).
        self._entries = self._table.entries
        # The entries a `set` may write without the gate: the table's map, except while the
        # cache is being turned off (then empty: every set waits at the gate). In direct mode
        # the table holds nothing, so every call goes to the mode.
        self._hot: Mapping[StateKey, Entry] = self._entries
        self._parts: StoreParts | None = None
        self._mode: Mode = NotOpen()
        self._opened = False
        self._closed = False
        self._hits = 0  # gets served from memory
        self._misses = 0  # gets that had to look further
        self._metrics: MetricsReporter | None = None  # off unless statsd_host / otel is set
        # switches between local-first and direct mode under running calls (reconfigure)
        self._gate = ModeGate()
        self._reconfiguring = asyncio.Lock()
        self._watcher: ConfigWatcher | None = None  # with watch_config
        #: the cache turned off but its backlog not yet central (see `PendingTurnOff`)
        self._turning_off: PendingTurnOff | None = None

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls: type[_Store], **kwargs: Any) -> _Store:
        store = cls(**kwargs)
        await store._open()  # an instance of this class, not yet returned to anyone
        return store

    async def __aenter__(self: _Store) -> _Store:
        await self._open()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _open(self) -> None:
        """Open (once): the shared parts, the mode, metrics and the config watcher."""
        if self._opened:
            if self._closed:
                raise StoreClosed("this store was closed; open a new StateStore")
            return
        s = self.settings
        self._parts, self._mode = await _open_mode(
            s, table=self._table, sink=self._given_sink, policies=self._policies,
            on_conflict=self._on_conflict, claims=self._claims)
        self._opened = True
        if not s.enabled and isinstance(self._mode, LocalFirstMode):
            self._start_turn_off(self._mode)  # a backlog found in the file: flush, then off
        self._metrics = start_reporter(self)
        if s.watch_config:
            self._watcher = ConfigWatcher(self, config_file_path())
            try:
                await self._watcher.start()
            except BaseException:
                await self.close()
                raise

    async def close(self, *, timeout: float | None = None) -> None:
        """Flush what can be flushed within `timeout` seconds (default ``close_timeout``),
        then close. Safe twice."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        if self._watcher is not None:
            await self._watcher.stop()
        if self._turning_off is not None:
            await self._end_turn_off()
            if isinstance(self._mode, LocalFirstMode):
                log.warning("closing with the cache's turn-off still pending: the writes the "
                            "central DB lacks stay in %s, and the next start flushes them "
                            "before it turns the cache off", self._mode.cache.path)
        async with self._gate.exclusive():  # a mode switch in progress finishes first
            await self._mode.stop(self.settings.close_timeout if timeout is None else timeout)
            if self._metrics is not None:
                await self._metrics.stop()  # the last report: what the final flush did
            await self._mode.close()
            if self._parts is not None:
                await self._parts.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def config_watcher(self) -> ConfigWatcher | None:
        """The watcher of airflow.cfg (with ``watch_config``), else None."""
        return self._watcher

    @property
    def sink(self) -> Sink | None:
        """The sink to the central DB (None before the store is open)."""
        return self._parts.sink if self._parts is not None else self._given_sink

    @property
    def central_store(self) -> CentralStore | None:
        """The SQL central store behind this store (None when another sink is used)."""
        sink = self.sink
        sink = sink.inner if isinstance(sink, ThreadedSink) else sink
        return sink if isinstance(sink, CentralStore) else None

    def events_pending(self, owners: Iterable[str]) -> int:
        """How many events of `owners` the central DB does not hold yet (0 with the cache off:
        there every emit is central when it returns)."""
        worker = self._mode.worker
        if worker is None:
            return 0
        return sum(worker.outbox.pending_of(owner) for owner in owners)

    @property
    def sync_worker(self) -> SyncWorker | None:
        """The sync worker (None with the cache off): its named flush steps, for tests."""
        return self._mode.worker

    @property
    def local_cache(self) -> LocalCache | None:
        """The local cache (None with the cache off)."""
        return self._mode.cache

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
            e = await self._mode.read((owner, key))
        if e is None or e.data is None:
            return default
        return e.obj if e.obj is not NOT_DECODED else decode(e.data)

    async def get_many(self, owner: str, keys: Iterable[str]) -> dict[str, Any]:
        """The values of the keys of `owner` that have one (missing keys are left out)."""
        if self._closed:
            raise self._closed_error()
        keys = list(keys)
        async with self._gate.call():
            read = self._mode.read
            found = await asyncio.gather(*(read((owner, k)) for k in keys))
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
            e = await self._mode.read((owner, key))
            if e is None or e.data is None:
                return None
            return record_of((owner, key), e, self._mode.conflicted())

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
        check_key(k)
        async with self._gate.call():
            row = await self._mode.read_central(k)
            if row is None or row.data is None:
                return None
            return record_of(k, entry_from_row(row), ())

    async def items(self, owner: str) -> AsyncIterator[Record]:
        """The records of `owner` this store holds (call `load(owner)` first to refresh)."""
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():  # not held while the caller iterates
            records = await self._mode.records(owner)
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
            return await self._mode.load(owner)

    # -- writing -------------------------------------------------------------------------

    async def set(
        self, owner: str, key: str, value: Any, *, durability: Durability | None = None
    ) -> int:
        """Set ``(owner, key)`` to `value`; return the new version once `durability` holds."""
        if self._closed:
            raise self._closed_error()
        if self._lost:  # another writer claimed an owner from this store
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._checks_values:  # some owner's max policy declares an order
            self._policies.check_value(owner, value, data)
        if durability is None:
            durability = self._durability
        elif durability != "memory" and durability != "local" and durability != "central":
            check_durability(durability)  # raises, before anything is written
        k = (owner, key)
        try:
            e = self._hot.get(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(owner, key)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
        if e is None:  # a key not in memory, or direct mode: in one mode from start to end
            async with self._gate.call():
                return await self._mode.set(k, data, obj, durability)
        # the hot path: one call into the table, which makes the write in memory (inline there).
        # Looked up as the table's method each time: CPython specializes that lookup, not the
        # call of a bound method kept in an attribute of the store (~5% of a set on 3.11)
        version = self._table.write(k, e, data, obj, durability == "memory")
        if durability == "memory":
            return version
        return await self._mode.persist(k, e, version, durability)

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
        if self._lost:
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._checks_values:  # some owner's max policy declares an order
            self._policies.check_value(owner, value, data)
        mode = self._durability if durability is None else check_durability(durability)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
        async with self._gate.call():
            return await self._mode.compare_and_set((owner, key), data, obj, expected_version,
                                                    mode)

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
        if self._lost:
            self._claims.check(owner)
        mode = self._durability if durability is None else check_durability(durability)
        async with self._gate.call():
            return await self._mode.delete((owner, key), mode)

    # -- events --------------------------------------------------------------------------

    async def emit(
        self, owner: str, payload: Any, *, watermark: Any, key: str | None = None,
        watermark_key: str = WATERMARK_KEY, durability: Durability | None = None,
        flush: bool = False,
    ) -> int:
        """Emit an event with `payload` and advance ``(owner, watermark_key)`` to `watermark`,
        as one: the central DB commits the event with the watermark in one transaction, once
        per `key` (default: `watermark`'s string form, see `event_key`). Returns the
        watermark's new version once `durability` holds (as `set`).

        The event and the watermark are one local commit (the outbox of the cache file). A
        flush carries the outbox with the dirty state; the central DB de-duplicates by
        ``(owner, key)`` (a replay is a no-op) and refuses the events of an owner this store
        lost (a zombie). For an asset's owner (``asset_watcher:<name>``) the event becomes
        Airflow asset events, as a yielded ``TriggerEvent`` does. Events of one owner reach
        the central DB in emit order. `flush`: start a flush now rather than within
        ``flush_interval``. ``durability="central"`` returns once the central DB has committed
        the event with its watermark (it starts a flush): what a source that must be told
        (an SQS delete, say) waits for; `CentralUnavailable` when it has not within
        ``central_timeout`` (the event stays in the outbox and goes out later).

        Raises `ValueEncodingError` / `ValueTooLarge` for a payload that is not JSON or is
        larger than ``max_value_bytes``, `InvalidName` for a bad owner or key, and
        `EventsUnsupported` where the event cannot commit with its watermark (``sink =
        airflow``, the cache turned off): nothing is written then.
        """
        return await self.emit_many(
            owner, [(event_key(watermark) if key is None else key, payload)],
            watermark=watermark, watermark_key=watermark_key, durability=durability,
            flush=flush)

    async def emit_many(
        self, owner: str, events: Sequence[tuple[str, Any]], *, watermark: Any,
        watermark_key: str = WATERMARK_KEY, durability: Durability | None = None,
        flush: bool = False,
    ) -> int:
        """`emit` for a batch: the events (``(key, payload)`` pairs, in order) and the
        watermark past the last of them, as one local commit (and then one central
        transaction), whatever their number. A crash before that commit leaves none of them;
        after it, all of them reach the central DB, each once per ``(owner, key)``.

        Every event is checked before anything is staged: a bad payload or key raises and
        nothing is written. No events: the watermark alone is set.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        if self._lost:
            self._claims.check(owner)
        staged = [(check_name("key", key), encode(payload, self._max_value_bytes))
                  for key, payload in events]
        encode(watermark, self._max_value_bytes)  # refused before the events are staged
        check_name("watermark_key", watermark_key)
        if durability is not None:
            check_durability(durability)
        await self._require_event_sink(owner)
        worker = self._mode.worker
        if worker is None:
            raise EventsUnsupported(
                "emit needs the local cache (enabled = true): with the cache off there is no "
                "outbox to commit the event with its watermark; turn the cache on, or yield a "
                "TriggerEvent and set the watermark (at least once)")
        # Staged before the watermark's write: the cache file commits the events in the same
        # transaction as the watermark or an earlier one, never after it (see Outbox).
        for key, data in staged:
            worker.outbox.add(owner, key, data)
        version = await self.set(owner, watermark_key, watermark, durability=durability)
        if flush:
            worker.kick()
        return version

    #: the central DB takes asset events (checked once, by the first emit of an asset)
    _asset_events_ready = False

    async def _require_event_sink(self, owner: str) -> None:
        sink = self.sink
        if sink is None or not carries_events(sink):
            raise EventsUnsupported(
                "emit cannot commit an event with its watermark through the sink "
                f"{self.settings.sink!r}: "
                "Airflow's state store and Airflow's event path are two transactions, so a "
                "crash between them loses or repeats the event. Use sink = api (localstate's "
                "plugin in Airflow's API server) or sink = sql with central_url set to "
                "Airflow's metadata DB; or, for at-least-once, yield a TriggerEvent and then "
                "set the watermark")
        central = self.central_store
        if central is None or asset_name(owner) is None or self._asset_events_ready:
            return
        check = central.asset_events_ready()
        try:
            ready = await (sink.call(check) if isinstance(sink, ThreadedSink) else check)
        except CentralUnavailable:
            return  # not known now: the emit goes on (the flush logs if none can be made)
        if not ready:
            raise EventsUnsupported(
                f"{NO_ASSET_EVENTS}, and {owner}'s central DB {central.url} is not (or Airflow "
                "is not importable here); use sink = api (localstate's plugin in Airflow's API "
                "server), or set central_url to Airflow's metadata DB")
        self._asset_events_ready = True

    def event_figures(self) -> dict[str, OwnerEvents]:
        """Each owner's events since the store opened: emitted, pending (in the outbox now),
        committed, duplicates, refused, and the oldest pending event's time."""
        worker = self._mode.worker
        return {} if worker is None else worker.outbox.by_owner()

    # -- claims --------------------------------------------------------------------------

    @property
    def can_claim(self) -> bool:
        """Whether this store's sink keeps claim epochs (the ``sql`` sink does; Airflow's
        state store, the ``airflow`` sink, does not)."""
        return isinstance(self.sink, ClaimingSink)

    async def claim(self, owner: str, *, unless_claimed_since: float | None = None,
                    hold: bool = False) -> int:
        """Take `owner` over for this store: bump its claim epoch in the central DB (recording
        this store's ``triggerer_id``), then refresh its keys from there; return the epoch.

        From then on the central DB refuses any flushed write of `owner` from a store that
        holds a lower epoch (a zombie: a triggerer the trigger was moved away from), whatever
        the conflict policy; that store raises `OwnerLost` for its later writes of `owner`.
        Writes this store made before the claim are flushed first, under the claim they were
        made in. Within one claim the conflict policies apply as before.

        `unless_claimed_since` (POSIX time): claim only if nobody claimed `owner` after then;
        `OwnerLost` otherwise (a late claim never takes an owner back from its new holder).

        `hold`: should the claim not be made now (`CentralUnavailable`, the caller claiming
        again later), `owner`'s writes stay in this store until a claim of it is made (they go
        out under it) or refused, or `release` lets them go: the previous holder's claim
        stands until then, and would refuse them.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        claims = self._claims
        try:
            sink = claiming_sink(self.sink)
            async with self._gate.call():
                worker, cache = self._mode.worker, self._mode.cache
                return await claim_owner(
                    claims, sink, owner, claimant=self.triggerer_id,
                    writer=cache.writer_id if cache is not None else None,
                    dirty=self._table.dirty, flush=worker.flush if worker is not None else None,
                    load=self._mode.load if worker is not None else None,
                    patience=2 * self.settings.central_transaction_timeout,
                    unless_claimed_since=unless_claimed_since)
        except CentralUnavailable:
            if hold:
                claims.hold(owner)
            raise
        except LocalStateError:  # refused for good (a newer claim, a sink keeping none)
            claims.unhold(owner)
            raise

    def abandon_claim(self, owner: str) -> None:
        """Stop waiting for a claim of `owner` that `claim` (with ``hold``) could not make: the
        caller leaves before it is made (a trigger moved to another triggerer during an
        outage). Once no other caller waits for it, the owner's held writes go out, fenced as
        any write made without the claim: refused, with their events, if another store
        claimed the owner since. Unlike `release`, the owner's entries stay (another trigger
        here may share them: an asset's owner) and no release is recorded."""
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        self._claims.abandon(owner)

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
            return await self._mode.flush()

    async def release(self, owner: str, *, timeout: float | None = None) -> ReleaseReport:
        """`owner` left this store: flush its writes, then drop its entries from memory and
        from the cache file once the central DB holds them (see the module
        docstring's invariants).

        Waits up to `timeout` seconds (default ``central_timeout``) for the flush; what the
        central DB does not hold by then stays, and is flushed as usual.

        When this store holds a claim of `owner`, the release is recorded in the owner's
        history (its epoch, this store's ``triggerer_id``, the time), in a transaction of its
        own after the flush, within what is left of `timeout` (`ReleaseReport.recorded`).
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        self._claims.unhold(owner)  # leaving: its writes go out, fenced as any
        wait = self.settings.central_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        async with self._gate.call():
            worker = self._mode.worker
            report = ReleaseReport() if worker is None else (  # cache off: nothing is held
                await _release_owner(self._table, worker, owner, wait))
            left = max(0.0, deadline - time.monotonic())
            return dataclasses.replace(report, recorded=await self._record_release(owner, left))

    async def _record_release(self, owner: str, timeout: float) -> bool:
        """Record `owner`'s release in its history, at the epoch this store holds; whether it
        was (none held, or a sink without history: nothing to record)."""
        epoch = self._claims.epoch_of(owner)
        sink = self.sink
        if not epoch or not isinstance(sink, ReleaseRecording):
            return False
        cache = self._mode.cache
        try:
            return await asyncio.wait_for(sink.record_release(
                owner, epoch=epoch, claimant=self.triggerer_id,
                writer=cache.writer_id if cache is not None else None), timeout)
        except (LocalStateError, asyncio.TimeoutError) as exc:
            log.warning("the release of owner %r (claim epoch %d) is not in its history "
                        "(%s within %g s); the owner's writes are flushed all the same",
                        owner, epoch, reason(exc), timeout)
            return False

    def unflushed(self, keys: Iterable[StateKey] | None = None) -> list[Unflushed]:
        """The keys whose entry is dirty, or whose last flush lost a conflict, in key order
        (of `keys` only, when given).

        A snapshot (the entries are the store's own: read them, do not change them).
        """
        return self._mode.unflushed(keys)

    async def sync_local(self) -> None:
        """Wait until every write made so far is committed to the local cache file."""
        await self._mode.sync_local()

    def variable(self, key: str, *, owner: str) -> StateVariable:
        """A handle on one state variable: ``await sv.get()``, ``await sv.set(v)``."""
        return StateVariable(key, owner=owner, store=self)

    # -- settings at run time ------------------------------------------------------------

    async def reconfigure(self, settings: Settings) -> tuple[str, ...]:
        """Apply the live settings of `settings` to the running store; return those changed.

        Live: ``enabled``, ``flush_interval``, ``max_batch``, ``durability`` (see
        `LIVE_SETTINGS`); a change of any other setting is logged and applies at the next
        start. Turning the cache on opens the local cache and starts the sync worker.

        Turning it off never leaves an acknowledged write behind: the cache's backlog is
        flushed first, then new calls are held back, the rest flushed, the local cache closed,
        and every call goes to the central DB (a call in progress finishes first). While the
        central DB cannot take the backlog the turn-off is pending (`PendingTurnOff`): the
        store keeps serving from the cache and flushing, and switches once the backlog is
        central. This call waits for the switch up to ``close_timeout`` seconds, then returns
        with it pending (``stats().cache_turning_off``).
        """
        if self._closed:
            raise self._closed_error()
        if not self._opened or self._parts is None:
            raise LocalStateError("open the store before reconfiguring it")
        parts = self._parts
        async with self._reconfiguring:  # one at a time: each compares with the one before
            changed, new = _live_changes(self.settings, settings)
            if not changed:
                return ()
            if new.enabled and self._turning_off is not None:
                await self._end_turn_off()  # on again before the switch: the cache stays
            turn_on = new.enabled and isinstance(self._mode, DirectMode)
            async with self._gate.switch() if turn_on else self._gate.exclusive():
                if self._closed:
                    raise self._closed_error()
                if turn_on:
                    self._mode = await _turned_on(self._mode, parts, new)
                self._durability = new.durability
                self._table.kick_at = new.max_batch
                self._mode.retune(new)
                self.settings = new
            log.info("applied %s", ", ".join(f"{n}={getattr(new, n)!r}" for n in changed))
            if (not new.enabled and "enabled" in changed
                    and isinstance(self._mode, LocalFirstMode)):
                pending = self._turning_off or self._start_turn_off(self._mode)
                if not await pending.wait(new.close_timeout):
                    log.warning(
                        "turning the local cache off is pending: %d writes are not in the "
                        "central DB yet (%s); the store serves from the local cache and "
                        "switches once they are flushed", len(self._table.dirty),
                        pending.last_error or "the flush has not finished")
            return changed

    def _start_turn_off(self, mode: LocalFirstMode) -> PendingTurnOff:
        self._turning_off = PendingTurnOff(
            mode, self._finish_turn_off,
            retry_interval=max(0.1, min(1.0, self.settings.flush_interval)))
        return self._turning_off

    async def _end_turn_off(self) -> None:
        pending, self._turning_off = self._turning_off, None
        if pending is not None:
            await pending.cancel()

    async def _finish_turn_off(self) -> bool:
        """The switch of a pending turn-off (its backlog just flushed): hold the calls back,
        flush the rest within ``close_timeout``, and go direct. False: that flush failed (the
        cache stays on, the turn-off pending)."""
        parts = self._parts
        assert parts is not None
        async with self._gate.switch():
            mode = self._mode
            if self._closed:
                return False  # the close flushes; what it cannot stays in the file
            if self.settings.enabled or not isinstance(mode, LocalFirstMode):
                return True  # nothing left to switch
            self._hot = {}  # from here every set, hot path included, waits
            try:
                self._mode = await _turned_off(mode, parts, self.settings.close_timeout)
            except LocalStateError:
                return False
            finally:
                self._hot = self._entries  # empty in direct mode
            self._mode.retune(self.settings)
        self._turning_off = None
        return True

    def stats(self) -> StoreStats:
        mode = self._mode
        return store_stats(
            table=self._table, worker=mode.worker, cache=mode.cache, sink=self.sink,
            reader=self._parts.reader if self._parts is not None else None,
            hits=self._hits, misses=self._misses,
            cache_enabled=isinstance(mode, LocalFirstMode),
            config_error=self._watcher.last_error if self._watcher is not None else None,
            turning_off=self._turning_off, sources=self.sources,
        )


# -- opening the parts and the first mode ----------------------------------------------------


async def _open_parts(
    s: Settings, *, table: EntryTable, sink: Sink | None, policies: PolicyMap,
    on_conflict: Callable[[ConflictInfo], None] | None, claims: ClaimBook,
) -> StoreParts:
    """Open the sink the settings name (unless one is given) and the read-through."""
    owns_sink = sink is None
    if sink is None:
        sink = await _open_central(s)
    return StoreParts(table=table, sink=sink, reader=ReadThrough(sink),
                      triggerer_id=s.resolved_triggerer_id, policies=policies,
                      on_conflict=on_conflict, claims=claims, owns_sink=owns_sink)


async def _open_central(s: Settings) -> Sink:
    """The sink to the central DB that the settings `s` name."""
    if s.sink == "airflow":
        # Airflow's state store through the triggerer's accessors: they talk over the trigger
        # loop's comms, so this sink runs on the loop the store was opened on, not a thread
        sink = process_sink()
        if s.api_url is not None:
            # with the plugin in Airflow's API server: misses of asset owners read there, one
            # request per batch, instead of one aget each through the supervisor
            sink.use_batch_reads(await _asset_state_reader(s, s.api_url))
        return sink
    if s.sink == "api":
        # a localstate API server over HTTP: no database credentials in this process (httpx,
        # the ``client`` extra, is imported only by a store that uses it)
        from localstate._sync.sinks.api_sink import ApiSink

        return (await ThreadedSink.open(lambda: ApiSink.open(s)) if s.central_thread
                else await ApiSink.open(s))
    url, upgrade = s.resolved_central_url, s.upgrade_schema

    async def opened() -> CentralStore:
        # the store starts during a central outage: it serves its cache and flushes later
        central = await CentralStore.open(url, upgrade_schema=upgrade, defer_if_unreachable=True,
                                          transaction_timeout=s.central_transaction_timeout)
        central.asset_mirror = None if s.asset_mirror == "off" else AssetMirror(s.asset_mirror)
        central.use_history(HistoryPolicy.of(s))
        return central

    if s.central_thread:
        return await ThreadedSink.open(opened)
    return await opened()


async def _asset_state_reader(s: Settings, api_url: str) -> Sink:
    """Reads Airflow's asset_state_store through localstate's app in Airflow's API server
    (`localstate._sync.sinks.asset_states`), on a thread of its own when ``central_thread`` is on: a
    batch of misses then costs the trigger loop one turn, not each of the HTTP exchange's."""
    from localstate._sync.sinks.api_sink import ApiSink  # httpx: the ``client`` extra, as above

    async def reader() -> Sink:
        # a server that hangs delays a batch of misses by at most 10 s; then they are read
        # through the accessors
        return ApiSink(api_url, s.api_token, timeout=min(s.central_timeout, 10.0),
                       read_source=ASSET_STATE_SOURCE, ca_bundle=s.api_ca_bundle)

    return (await ThreadedSink.open(reader, name="localstate-asset-reads") if s.central_thread
            else await reader())


async def _open_mode(
    s: Settings, *, table: EntryTable, sink: Sink | None, policies: PolicyMap,
    on_conflict: Callable[[ConflictInfo], None] | None, claims: ClaimBook,
) -> tuple[StoreParts, Mode]:
    """Open a store's shared parts and its first mode; on an error nothing is left open.

    ``enabled``: local-first, the cache file loaded as it is. Cache off: direct mode, except
    that the cache file is opened first (`_direct_or_backlog`): a file still holding writes the
    central DB lacks starts the store local-first, for the store to turn the cache off once
    they are flushed (a `PendingTurnOff`)."""
    parts = await _open_parts(s, table=table, sink=sink, policies=policies,
                              on_conflict=on_conflict, claims=claims)
    try:
        mode: Mode = (await LocalFirstMode.start(parts, s, keep_clean=True) if s.enabled
                      else await _direct_or_backlog(parts, s))
    except BaseException:
        await parts.close()
        raise
    return parts, mode


# -- the live toggle: what changed, and the modes it switches between --------------------------


def _live_changes(current: Settings, settings: Settings) -> tuple[tuple[str, ...], Settings]:
    """The live settings `settings` changes from `current`, and `current` with them applied.

    A change of a setting that is not live is logged: it applies at the next start.
    """
    changed = tuple(n for n in LIVE_SETTINGS if getattr(settings, n) != getattr(current, n))
    later = [n for n in SETTING_NAMES
             if n not in LIVE_SETTINGS and getattr(settings, n) != getattr(current, n)]
    if later:
        log.warning("setting(s) %s changed; they apply when the store next starts (live: "
                    "%s)", ", ".join(later), ", ".join(LIVE_SETTINGS))
    if not changed:
        return (), current
    return changed, dataclasses.replace(
        current, **{n: getattr(settings, n) for n in changed},
        sources={**current.sources,
                 **{n: settings.sources.get(n, "default") for n in changed}},
    )


async def _direct_or_backlog(parts: StoreParts, s: Settings) -> Mode:
    """The first mode of a store opened with the cache off.

    Without a cache file: direct mode, under a writer id of its own (a file the cache creates
    later takes it); no file is created (a task on a worker host keeps none). With one: the
    file is opened first. If it holds writes the central DB lacks (acknowledged before a
    restart, or by a turn-off that could not finish before the last close), local-first, for
    the store to turn the cache off once they are flushed; else direct mode under the file's
    id, the file kept locked. A file that cannot be opened (another live process holds it, it
    is damaged) is logged and left alone: direct mode under an id of its own."""
    path = s.resolved_cache_path
    if not await asyncio.to_thread(path.exists):
        return DirectMode(parts)
    try:
        mode = await LocalFirstMode.start(parts, s, keep_clean=False)
    except LocalStateError as exc:
        log.log(logging.INFO if isinstance(exc, CacheLocked) else logging.WARNING,
                "the cache is off and its file %s cannot be used (%s): any writes it holds "
                "are not flushed by this store", path, exc)
        return DirectMode(parts)
    if parts.table.dirty:
        log.warning("the cache is off (enabled = False), but %s holds %d writes the central DB "
                    "lacks: the store serves from the local cache until they are flushed, then "
                    "turns it off", mode.cache.path, len(parts.table.dirty))
        return mode
    return await _turned_off(mode, parts, s.close_timeout)


async def _turned_off(mode: LocalFirstMode, parts: StoreParts, timeout: float) -> DirectMode:
    """Turn the cache off: flush every dirty key (within `timeout` s), close the cache and
    empty the table and file, and return the direct mode that writes under the file's id.

    When that flush fails, `mode` is left running and the error raised (`CentralUnavailable`).
    """
    writer = mode.cache.writer_id
    lock = await mode.drain_and_stop(timeout)
    return DirectMode(parts, lock, writer)


async def _turned_on(mode: Mode, parts: StoreParts, new: Settings) -> Mode:
    """Turn the cache on (from direct mode): open the local cache, keeping only the writes
    the central DB lacks, and start the sync worker. The cache file's lock, held by direct
    mode, passes to the cache; on an error `mode` stays in force."""
    direct = mode if isinstance(mode, DirectMode) else None
    lock = direct.lock if direct is not None else None
    try:
        # a file created now takes the id direct mode wrote under
        return await LocalFirstMode.start(parts, new, keep_clean=False, lock=lock,
                                          new_writer_id=direct.writer if direct else None)
    except BaseException:
        if direct is not None and lock is not None and not lock.held:
            # the failed open let the file go: take it back, or write under an id of our own
            with contextlib.suppress(LocalStateError):
                lock.acquire()
            if not lock.held:
                direct.lost_file()
        raise


# -- releasing an owner (see the module docstring's invariants) ------------------------------


async def _release_owner(table: EntryTable, worker: SyncWorker, owner: str,
                         timeout: float) -> ReleaseReport:
    """Flush `owner`'s dirty entries (waiting up to `timeout` seconds), then drop the clean
    ones (see the module docstring)."""
    waits = []
    for k in table.keys_of(owner):
        e = table.entries[k]
        version = e.version
        if e.dirty:
            # registered before any await: the flush that carries `version` settles it
            fut = worker.expect_flush(k, version)
            waits.append(worker.wait_flushed(k, version, timeout, fut))
    unflushed = refused = 0
    epoch = None
    if waits:
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, OwnerLost):
                refused += 1
                epoch = outcome.current
            elif isinstance(outcome, LocalStateError):
                unflushed += 1  # CentralUnavailable (timeout) or WriteRejected (conflict)
            elif isinstance(outcome, BaseException):
                raise outcome
    dropped, kept = table.release(owner)
    return ReleaseReport(dropped=dropped, kept=kept,
                         flushed=len(waits) - unflushed - refused, unflushed=unflushed,
                         refused=refused, claimed_at_epoch=epoch)


# -- StateVariable: one variable, as a handle and as class-level calls ------------------------

#: the process's one default store (see `localstate._default_store`)
DEFAULT: DefaultStore[StateStore] = DefaultStore()


async def process_store() -> StateStore:
    """The process's default store, for a caller on its loop (opened from the settings on
    first use; see `DefaultStore.get`)."""
    return await DEFAULT.get(StateStore.open)


async def _class_get(key: str, *, owner: str, default: Any = None) -> Any:
    return await (await process_store()).get(owner, key, default)


async def _class_set(
    key: str, value: Any, *, owner: str, durability: Durability | None = None
) -> int:
    return await (await process_store()).set(owner, key, value, durability=durability)


async def _class_delete(key: str, *, owner: str) -> bool:
    return await (await process_store()).delete(owner, key)


class StateVariable:
    """One state variable: a key and its owner, in a store.

    As a handle on one variable of a store::

        sv = store.variable("watermark", owner="asset_watcher:orders")
        await sv.set(41)
        await sv.get(default=0)

    As class-level calls on the process's default store, mirroring Airflow's
    ``Variable.get/set``::

        await StateVariable.set("watermark", 41, owner="asset_watcher:orders")
        await StateVariable.get("watermark", owner="asset_watcher:orders", default=0)

    The default store is the one given to `StateVariable.configure(store)`, else one opened
    from the settings (environment, ``airflow.cfg``) on first use, in the running event loop.
    """

    def __init__(self, key: str, *, owner: str, store: StateStore) -> None:
        self.key = key
        self.owner = owner
        self.store = store

    def __repr__(self) -> str:
        return f"StateVariable(owner={self.owner!r}, key={self.key!r})"

    async def _get(self, default: Any = None) -> Any:
        return await self.store.get(self.owner, self.key, default)

    async def _set(self, value: Any, *, durability: Durability | None = None) -> int:
        return await self.store.set(self.owner, self.key, value, durability=durability)

    async def _delete(self) -> bool:
        return await self.store.delete(self.owner, self.key)

    get = ClassOrInstance(_class_get, _get)
    set = ClassOrInstance(_class_set, _set)
    delete = ClassOrInstance(_class_delete, _delete)

    async def record(self) -> Record | None:
        return await self.store.record(self.owner, self.key)

    async def compare_and_set(self, value: Any, *, expected_version: int) -> int:
        return await self.store.compare_and_set(
            self.owner, self.key, value, expected_version=expected_version
        )

    @staticmethod
    def configure(store: StateStore | None) -> None:
        """Make `store` (a `StateStore`) the process's default store (None: open one from
        the settings on first use)."""
        if store is not None and not isinstance(store, StateStore):
            raise InvalidInput(f"the default store must be a StateStore, not {store!r}")
        DEFAULT.configure(store)

    @staticmethod
    def default_store() -> StateStore | None:
        return DEFAULT.current()
