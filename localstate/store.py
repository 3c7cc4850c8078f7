"""`StateStore`: the public store. Local-first get/set in front of the sync worker.

The hot path is a dict: `get` of a known key and `set` in ``memory`` durability touch nothing
but memory; ``local`` waits for the group commit that carries the write; ``central`` waits for
the flush that puts it in the central DB. With the cache turned off (``enabled=False``) every
call goes straight to the central DB, one transaction per `set`, as Airflow's own
``Variable.set`` does.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from localstate.claims import ClaimBook, claim_owner, claiming_sink
from localstate.codec import IMMUTABLE_TYPES, decode, encode
from localstate.config import Settings, config_file_path
from localstate.entry import NOT_DECODED, Entry, StateKey, entry_from_row, record_of
from localstate.entry_table import EntryTable
from localstate.errors import InvalidInput, LocalStateError, StoreClosed
from localstate.local_cache import LocalCache
from localstate.metrics import MetricsReporter, start_reporter
from localstate.mode_gate import ModeGate
from localstate.mode_switch import live_changes, open_mode, toggled
from localstate.model import (
    Durability,
    Record,
    check_durability,
    check_key,
    check_name,
    refuse_unhashable_names,
)
from localstate.modes import Mode, NotOpen, Unflushed
from localstate.release import ReleaseReport, release_owner
from localstate.reload import ConfigWatcher
from localstate.stats import StoreStats, store_stats
from localstate.store_parts import StoreParts
from localstate.sync.central_store import CentralStore
from localstate.sync.conflicts import PolicyMap
from localstate.sync.sink_thread import ThreadedSink
from localstate.sync.sinks import ClaimingSink, Sink
from localstate.sync.worker import ConflictInfo, FlushReport, SyncWorker

if TYPE_CHECKING:
    from localstate.variable import StateVariable

__all__ = ["StateStore"]

log = logging.getLogger(__name__)


class StateStore:
    """A local-first state store. ``store = await StateStore.open(...)`` or ``async with``.

    Every option may also come from the environment or ``airflow.cfg`` (see
    `localstate.config`); explicit arguments win.

    What it owns: its settings, its mode (`LocalFirstMode` or `DirectMode`, replaced only by
    `reconfigure` under the `ModeGate`), the parts both modes share (`StoreParts`, from open
    to close), and its get counters. The entries belong to its `EntryTable`.
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
        self._policies = PolicyMap(settings.conflict_policy)
        self._on_conflict = on_conflict
        #: the claim epochs this store holds, and the owners it lost (see `claim`)
        self._claims = ClaimBook()
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
        # the hot path's one call, bound once (a lookup less per set than self._table.write)
        self._write_entry = self._table.write
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

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, **kwargs: Any) -> StateStore:
        store = cls(**kwargs)
        await store._open()  # an instance of this class, not yet returned to anyone
        return store

    async def __aenter__(self) -> StateStore:
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
        self._parts, self._mode = await open_mode(
            s, table=self._table, sink=self._given_sink, policies=self._policies,
            on_conflict=self._on_conflict, claims=self._claims)
        self._opened = True
        self._metrics = start_reporter(self)
        if s.watch_config:
            self._watcher = ConfigWatcher(self, config_file_path())
            try:
                await self._watcher.start()
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        """Flush what can be flushed within ``close_timeout``, then close. Safe twice."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        if self._watcher is not None:
            await self._watcher.stop()
        async with self._gate.exclusive():  # a mode switch in progress finishes first
            await self._mode.stop(self.settings.close_timeout)
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
            e = self._hot.get(k)
        except TypeError:  # an unhashable owner or key (a list, say)
            refuse_unhashable_names(owner, key)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
        if e is None:  # a key not in memory, or direct mode: in one mode from start to end
            async with self._gate.call():
                return await self._mode.set(k, data, obj, durability)
        # the hot path: one call into the table, which makes the write in memory (inline there)
        version = self._write_entry(k, e, data, obj, durability == "memory")
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
        if self._claims.lost:
            self._claims.check(owner)
        data = encode(value, self._max_value_bytes)
        if self._policies.checks_values:  # some owner's max policy declares an order
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
        if self._claims.lost:
            self._claims.check(owner)
        mode = self._durability if durability is None else check_durability(durability)
        async with self._gate.call():
            return await self._mode.delete((owner, key), mode)

    # -- claims --------------------------------------------------------------------------

    @property
    def can_claim(self) -> bool:
        """Whether this store's sink keeps claim epochs (the ``sql`` sink does; Airflow's
        state store, the ``airflow`` sink, does not)."""
        return isinstance(self.sink, ClaimingSink)

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
        sink = claiming_sink(self.sink)
        async with self._gate.call():
            worker, cache = self._mode.worker, self._mode.cache
            return await claim_owner(
                self._claims, sink, owner, claimant=self.triggerer_id,
                writer=cache.writer_id if cache is not None else None, dirty=self._table.dirty,
                flush=worker.flush if worker is not None else None,
                load=self._mode.load if worker is not None else None)

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
        from the cache file once the central DB holds them (see `localstate.release`).

        Waits up to `timeout` seconds (default ``central_timeout``) for the flush; what the
        central DB does not hold by then stays, and is flushed as usual.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        async with self._gate.call():
            worker = self._mode.worker
            if worker is None:  # the cache is off: nothing is held
                return ReleaseReport()
            wait = self.settings.central_timeout if timeout is None else timeout
            return await release_owner(self._table, worker, owner, wait)

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
        if not self._opened or self._parts is None:
            raise LocalStateError("open the store before reconfiguring it")
        parts = self._parts
        async with self._reconfiguring:  # one at a time: each compares with the one before
            changed, new = live_changes(self.settings, settings)
            if not changed:
                return ()
            toggle = new.enabled != self.settings.enabled
            async with self._gate.switch() if toggle else self._gate.exclusive():
                if self._closed:
                    raise self._closed_error()
                if toggle:
                    if not new.enabled:
                        self._hot = {}  # from here every set, hot path included, waits
                    try:
                        self._mode = await toggled(self._mode, parts, new)
                    finally:
                        self._hot = self._entries  # empty in direct mode
                self._durability = new.durability
                self._table.kick_at = new.max_batch
                self._mode.retune(new)
                self.settings = new
            log.info("applied %s", ", ".join(f"{n}={getattr(new, n)!r}" for n in changed))
            return changed

    def stats(self) -> StoreStats:
        mode = self._mode
        return store_stats(
            table=self._table, worker=mode.worker, cache=mode.cache, sink=self.sink,
            reader=self._parts.reader if self._parts is not None else None,
            hits=self._hits, misses=self._misses,
            cache_enabled=self.settings.enabled,
            config_error=self._watcher.last_error if self._watcher is not None else None,
        )

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
        from localstate.variable import StateVariable

        return StateVariable(key, owner=owner, store=self)
