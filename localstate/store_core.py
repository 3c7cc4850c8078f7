"""`StoreCore`: what a `StateStore` owns, and its life from open to close.

`StateStore` (`localstate.store`) is a `StoreCore` with the calls on state variables (the hot
path of get and set, and every call the mode in force serves). This class holds the state those
calls read, and is the only code that replaces any of it:

* the settings in force (`settings`), replaced only by `reconfigure`;
* the mode in force (`LocalFirstMode` or `DirectMode`, `localstate.modes`), replaced only under
  the `ModeGate`'s switch (`reconfigure` through `mode_switch.turned_on`, and a turn-off's
  `_finish_turn_off` through `mode_switch.turned_off`), and ``_hot``, the map a `set` may
  write without the gate (the table's entries; empty while the cache turns off);
* the turn-off waiting for the central DB to take the cache's backlog (`PendingTurnOff`, None
  when none is), started by `reconfigure` or `open` and cancelled by `reconfigure` or `close`;
* the parts both modes share (`StoreParts`: sink, read-through, table), from open to close;
* the config watcher and metrics reporter it starts at open and stops at close, and the
  get counters its figures (`stats`) report.

The entries, dirty keys and absent keys belong to the `EntryTable` it makes; the claim epochs to
its `ClaimBook`.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from localstate.config import Settings, config_file_path
from localstate.conflicts import PolicyMap
from localstate.entry import Entry, StateKey
from localstate.entry_table import EntryTable
from localstate.errors import LocalStateError, StoreClosed
from localstate.local_cache import LocalCache
from localstate.local_first import LocalFirstMode
from localstate.metrics import MetricsReporter, start_reporter
from localstate.mode_gate import ModeGate
from localstate.mode_switch import live_changes, open_mode, turned_off, turned_on
from localstate.model import Durability
from localstate.modes import DirectMode, Mode, NotOpen
from localstate.pending_switch import PendingTurnOff
from localstate.reload import ConfigWatcher
from localstate.stats import StoreStats, store_stats
from localstate.store_parts import StoreParts
from localstate.sync.central_store import CentralStore
from localstate.sync.claims import ClaimBook
from localstate.sync.settle import ConflictInfo
from localstate.sync.sink_thread import ThreadedSink
from localstate.sync.sinks import Sink
from localstate.sync.worker import SyncWorker

__all__ = ["StoreCore"]

# the store's logger: what reconfigure logs is the store's
log = logging.getLogger("localstate.store")

_Store = TypeVar("_Store", bound="StoreCore")


class StoreCore:
    """A store's settings, mode, shared parts and life (see the module docstring); the calls
    on state variables are `StateStore`'s."""

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
        self._parts, self._mode = await open_mode(
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
            changed, new = live_changes(self.settings, settings)
            if not changed:
                return ()
            if new.enabled and self._turning_off is not None:
                await self._end_turn_off()  # on again before the switch: the cache stays
            turn_on = new.enabled and isinstance(self._mode, DirectMode)
            async with self._gate.switch() if turn_on else self._gate.exclusive():
                if self._closed:
                    raise self._closed_error()
                if turn_on:
                    self._mode = await turned_on(self._mode, parts, new)
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
                self._mode = await turned_off(mode, parts, self.settings.close_timeout)
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
            turning_off=self._turning_off,
        )
