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
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from localstate.codec import IMMUTABLE_TYPES, decode, encode
from localstate.config import Settings
from localstate.entry import NOT_DECODED, Entry, StateKey
from localstate.errors import (
    CentralError,
    InvalidInput,
    InvalidName,
    LocalStateError,
    StoreClosed,
    VersionConflict,
)
from localstate.local_cache import LocalCache
from localstate.metrics import MetricsReporter, start_reporter
from localstate.model import (
    Durability,
    FlushState,
    Record,
    check_durability,
    check_name,
    epoch_to_datetime,
)
from localstate.stats import StoreStats
from sync.central_store import CentralStore
from sync.conflicts import PolicyMap
from sync.read_through import ReadThrough
from sync.rows import CentralRow
from sync.sink_thread import ThreadedSink
from sync.sinks import Sink
from sync.worker import ConflictInfo, FlushReport, SyncWorker

if TYPE_CHECKING:
    from localstate.variable import StateVariable

__all__ = ["StateStore"]

log = logging.getLogger(__name__)
_now = time.time


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
        sink: Sink | None = None,
        on_conflict: Callable[[ConflictInfo], None] | None = None,
        **options: Any,
    ) -> None:
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
        self._max_batch = settings.max_batch
        self._direct = not settings.enabled
        self._policies = PolicyMap(settings.conflict_policy)
        self._on_conflict = on_conflict
        self._sink: Sink | None = sink
        self._owns_sink = sink is None
        self._cache: LocalCache | None = None
        self._worker: SyncWorker | None = None
        self._reader: ReadThrough | None = None
        self._entries: dict[StateKey, Entry] = {}
        #: dirty keys, each with the time of its oldest write the central DB lacks
        self._dirty: dict[StateKey, float] = {}
        self._absent: dict[StateKey, float] = {}
        self._opened = False
        self._closed = False
        self._sets = 0
        self._hits = 0  # gets served from memory
        self._misses = 0  # gets that had to look further
        self._metrics: MetricsReporter | None = None  # off unless statsd_host / otel is set

    # -- opening and closing -------------------------------------------------------------

    @classmethod
    async def open(cls, **kwargs: Any) -> StateStore:
        store = cls(**kwargs)
        await store._open()
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
        if self._opened:
            if self._closed:
                raise StoreClosed("this store was closed; open a new StateStore")
            return
        s = self.settings
        try:
            if self._sink is None:
                self._sink = await _open_central(s)
            self._reader = ReadThrough(self._sink)
            if not self._direct:
                self._cache = await LocalCache.open(
                    s.resolved_cache_path,
                    owner_id=self.triggerer_id,
                    local_sync="normal" if s.local_sync == "normal" else "full",
                    memory_window=s.memory_window,
                )
                self._entries = await self._cache.load()
                self._dirty = {k: e.updated_at for k, e in self._entries.items() if e.dirty}
                self._worker = SyncWorker(
                    entries=self._entries, dirty=self._dirty, cache=self._cache,
                    sink=self._sink, policies=self._policies,
                    flush_interval=s.flush_interval, max_batch=s.max_batch,
                    on_conflict=self._on_conflict,
                )
                self._worker.start()
                if self._dirty:
                    log.info("%d writes not yet in the central DB found in %s; flushing",
                             len(self._dirty), self._cache.path)
                    self._worker.kick()
        except BaseException:
            await self._release()
            raise
        self._opened = True
        self._metrics = start_reporter(self)

    async def close(self) -> None:
        """Flush what can be flushed within ``close_timeout``, then close. Safe twice."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        if self._worker is not None:
            await self._worker.stop(self.settings.close_timeout)
        if self._metrics is not None:
            await self._metrics.stop()  # the last report: what the final flush did
        await self._release()

    async def _release(self) -> None:
        if self._cache is not None:
            await self._cache.close()
        if self._reader is not None:
            await self._reader.close()
        if self._sink is not None and self._owns_sink:
            await self._sink.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def central_store(self) -> CentralStore | None:
        """The SQL central store behind this store (None when another sink is used)."""
        sink = self._sink.inner if isinstance(self._sink, ThreadedSink) else self._sink
        return sink if isinstance(sink, CentralStore) else None

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if self._opened and not self._closed:
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
            _refuse_names(owner, key)
        if e is not None:
            self._hits += 1
            data = e.data
            if data is None:
                return default
            obj = e.obj
            return obj if obj is not NOT_DECODED else decode(data)
        self._misses += 1
        e = await self._known((owner, key))
        if e is None or e.data is None:
            return default
        return e.obj if e.obj is not NOT_DECODED else decode(e.data)

    async def get_many(self, owner: str, keys: Iterable[str]) -> dict[str, Any]:
        """The values of the keys of `owner` that have one (missing keys are left out)."""
        if self._closed:
            raise self._closed_error()
        keys = list(keys)
        found = await asyncio.gather(*(self._known((owner, k)) for k in keys))
        return {
            k: (e.obj if e.obj is not NOT_DECODED else decode(e.data))
            for k, e in zip(keys, found, strict=True)
            if e is not None and e.data is not None
        }

    async def record(self, owner: str, key: str) -> Record | None:
        """The full record (value, version, stamps, flush state), or None."""
        if self._closed:
            raise self._closed_error()
        e = await self._known((owner, key))
        if e is None or e.data is None:
            return None
        return self._record((owner, key), e)

    async def items(self, owner: str) -> AsyncIterator[Record]:
        """The records of `owner` this store holds (call `load(owner)` first to refresh)."""
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        if self._direct:
            for row in await self._require_sink().read_owner(owner):
                if row.data is not None:
                    yield self._record((row.owner, row.key), _entry_from(row))
            return
        snapshot = [(k, e) for k, e in self._entries.items() if k[0] == owner]
        for k, e in sorted(snapshot):
            if e.data is not None:
                yield self._record(k, e)

    async def load(self, owner: str) -> int:
        """Refresh `owner`'s keys from the central DB in one query; return how many it has.

        Call it when this process takes over an owner (a trigger moved here): clean entries
        are replaced by the central records, dirty ones are left for the flush to reconcile.
        """
        if self._closed:
            raise self._closed_error()
        check_name("owner", owner)
        rows = await self._require_sink().read_owner(owner)
        if self._direct:
            return sum(1 for r in rows if r.data is not None)
        for row in rows:
            k = (row.owner, row.key)
            self._absent.pop(k, None)
            e = self._entries.get(k)
            if e is None:
                e = self._entries[k] = _entry_from(row)
            elif e.dirty or e.version == row.version:
                continue
            else:
                SyncWorker._adopt(e, row)
            self._stage(k, e)
        return sum(1 for r in rows if r.data is not None)

    async def _known(self, k: StateKey) -> Entry | None:
        """The entry of `k`, reading through to the central DB on a miss."""
        try:
            e = self._entries.get(k)
        except TypeError:
            _refuse_names(*k)
        if e is not None:
            return e
        check_name("owner", k[0])
        check_name("key", k[1])
        if self._direct:
            row = (await self._require_sink().read_many([k])).get(k)
            return None if row is None else _entry_from(row)
        expiry = self._absent.get(k)
        if expiry is not None and expiry > time.monotonic():
            return None
        row = await self._require_reader().fetch(k)
        e = self._entries.get(k)  # another coroutine may have filled it meanwhile
        if e is not None:
            return e
        if row is None:
            self._absent[k] = time.monotonic() + self.settings.absent_ttl
            return None
        self._absent.pop(k, None)
        e = self._entries[k] = _entry_from(row)
        self._stage(k, e)
        return e

    # -- writing -------------------------------------------------------------------------

    async def set(
        self, owner: str, key: str, value: Any, *, durability: Durability | None = None
    ) -> int:
        """Set ``(owner, key)`` to `value`; return the new version once `durability` holds."""
        if self._closed:
            raise self._closed_error()
        data = encode(value, self._max_value_bytes)
        if durability is None:
            durability = self._durability
        elif durability != "memory" and durability != "local" and durability != "central":
            check_durability(durability)  # raises, before anything is written
        k = (owner, key)
        if self._direct:
            return await self._set_direct(k, data, durability)
        try:
            e = self._entries.get(k)
        except TypeError:
            _refuse_names(owner, key)
        if e is None:
            e = await self._first_write(k)
        version = self._apply(
            k, e, data, value if type(value) in IMMUTABLE_TYPES else NOT_DECODED, durability
        )
        if durability == "memory":
            return version
        return await self._persist(k, e, version, durability)

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
        data = encode(value, self._max_value_bytes)
        k = (owner, key)
        if self._direct:
            raise InvalidInput(
                "compare_and_set needs the local cache (enabled=True): direct mode writes "
                "unconditionally"
            )
        try:
            found = self._entries.get(k)
        except TypeError:
            _refuse_names(owner, key)
        e = found if found is not None else await self._first_write(k)
        actual = e.version if e.data is not None else 0
        if actual != expected_version:
            raise VersionConflict(
                f"{owner}/{key} is at version {actual}, not {expected_version}",
                expected=expected_version, actual=actual,
            )
        return await self._write(
            k, e, data, value if type(value) in IMMUTABLE_TYPES else NOT_DECODED, durability
        )

    async def delete(
        self, owner: str, key: str, *, durability: Durability | None = None
    ) -> bool:
        """Delete ``(owner, key)``; return whether it had a value."""
        if self._closed:
            raise self._closed_error()
        k = (owner, key)
        if self._direct:
            e = await self._known(k)
            if e is None or e.data is None:
                return False
            await self._set_direct(k, None, durability)
            return True
        try:
            found = self._entries.get(k)
        except TypeError:
            _refuse_names(owner, key)
        e = found if found is not None else await self._first_write(k)
        if e.data is None:
            return False
        await self._write(k, e, None, None, durability)
        return True

    async def _first_write(self, k: StateKey) -> Entry:
        """A new entry for a key this store has not seen, based on the central record."""
        check_name("owner", k[0])
        check_name("key", k[1])
        row: CentralRow | None = None
        expiry = self._absent.get(k)
        if expiry is None or expiry <= time.monotonic():
            try:
                row = await self._require_reader().fetch(k)
            except CentralError as exc:
                # write anyway: the flush fences on "no central record" and the conflict
                # policy settles it if there was one
                log.warning("cannot read %s/%s from the central DB before writing it (%s); "
                            "writing locally", k[0], k[1], exc)
        e = self._entries.get(k)
        if e is None:
            e = self._entries[k] = (
                _entry_from(row) if row is not None
                else Entry(None, None, 0, 0.0, self.triggerer_id, 0)
            )
        self._absent.pop(k, None)
        return e

    def _apply(
        self, k: StateKey, e: Entry, data: str | None, obj: Any, durability: Durability
    ) -> int:
        """Make a write in memory; return its version. Synchronous: nothing sees it half done.

        A memory-durability write is staged for the local writer here too (one call less on
        the hot path); `_persist` does the waiting for the other modes.
        """
        e.data = data
        e.obj = obj
        version = e.version = e.version + 1
        e.updated_at = now = _now()
        e.updated_by = self.triggerer_id
        dirty = self._dirty
        if k not in dirty:
            dirty[k] = now
        self._sets += 1
        if len(dirty) >= self._max_batch:
            self._worker.kick()  # type: ignore[union-attr]  # set whenever not direct
        if durability == "memory":
            self._cache.stage(k, e)  # type: ignore[union-attr]  # set whenever not direct
        return version

    async def _persist(
        self, k: StateKey, e: Entry, version: int, durability: Durability
    ) -> int:
        """Wait until the write `version` of `k` holds at `durability`."""
        if durability == "memory":
            return version  # staged by _apply
        if durability != "central":
            await self._require_cache().commit(k, e)
            return version
        # Register the central waiter before awaiting the local commit: a flush running
        # meanwhile can carry this version (LocalCache.sync_now does not wait for a commit
        # already in flight), and a waiter registered after that flush was never settled, so
        # the set timed out with CentralUnavailable although the central DB held the write.
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
        mode = self._durability if durability is None else check_durability(durability)
        version = self._apply(k, e, data, obj, mode)
        return await self._persist(k, e, version, mode)

    async def _set_direct(
        self, k: StateKey, data: str | None, durability: Durability | None
    ) -> int:
        check_name("owner", k[0])
        check_name("key", k[1])
        if durability is not None:
            check_durability(durability)
        self._sets += 1
        row = await self._require_sink().write_direct(
            k[0], k[1], data, updated_at=time.time(), updated_by=self.triggerer_id
        )
        return row.version

    def _stage(self, k: StateKey, e: Entry) -> None:
        if self._cache is not None:
            self._cache.stage(k, e)

    # -- flushing and figures ------------------------------------------------------------

    async def flush(self) -> FlushReport:
        """Flush every dirty key now (waits for a flush in flight first); report what it did."""
        if self._closed:
            raise self._closed_error()
        if self._worker is None:
            return FlushReport()
        return await self._worker.flush()

    def stats(self) -> StoreStats:
        w, c, sink = self._worker, self._cache, self._sink
        now = time.time()
        oldest = min(self._dirty.values(), default=None)
        lags = list(w.lags) if w is not None else []
        last_error = (w.last_error if w is not None else None) or (
            c.last_error if c is not None else None)
        return StoreStats(
            sets=self._sets, gets=self._hits + self._misses, cache_hits=self._hits,
            read_through_queries=self._reader.queries if self._reader is not None else 0,
            local_commits=c.commits if c else 0, local_rows=c.rows_committed if c else 0,
            rows_per_commit=(c.rows_committed / c.commits) if c and c.commits else 0.0,
            dirty_keys=len(self._dirty),
            oldest_unflushed_s=0.0 if oldest is None else max(0.0, now - oldest),
            flushes=w.flushes if w else 0,
            central_transactions=sink.transactions if sink else 0,
            central_rows=sink.rows_written if sink else 0,
            conflicts=w.conflicts if w else 0,
            central_errors=w.central_errors if w else 0,
            last_flush_at=w.last_flush_at if w else None,
            flush_lag_p50_s=_percentile(lags, 0.5), flush_lag_p99_s=_percentile(lags, 0.99),
            last_error=None if last_error is None else str(last_error),
            keys_in_memory=len(self._entries), cache_enabled=not self._direct,
        )

    def variable(self, key: str, *, owner: str) -> StateVariable:
        """A handle on one state variable: ``await sv.get()``, ``await sv.set(v)``."""
        from localstate.variable import StateVariable

        return StateVariable(key, owner=owner, store=self)

    # -- helpers -------------------------------------------------------------------------

    def _record(self, k: StateKey, e: Entry) -> Record:
        w = self._worker
        if e.dirty:
            state = FlushState.DIRTY
        elif w is not None and k in w.conflicted:
            state = FlushState.CONFLICT
        else:
            state = FlushState.FLUSHED
        assert e.data is not None
        return Record(
            owner=k[0], key=k[1], value=decode(e.data), version=e.version,
            updated_at=epoch_to_datetime(e.updated_at), updated_by=e.updated_by,
            flush_state=state, central_version=e.synced_version,
        )

    def _require_sink(self) -> Sink:
        return _opened(self._sink)

    def _require_reader(self) -> ReadThrough:
        return _opened(self._reader)

    def _require_worker(self) -> SyncWorker:
        return _opened(self._worker)

    def _require_cache(self) -> LocalCache:
        return _opened(self._cache)


_T = TypeVar("_T")


def _refuse_names(owner: object, key: object) -> NoReturn:
    """Raise the `InvalidName` for names a dict lookup refused (unhashable, so not str)."""
    check_name("owner", owner)
    check_name("key", key)
    raise InvalidName(f"owner and key must be str, not {type(owner).__name__} and "
                      f"{type(key).__name__}")


def _opened(part: _T | None) -> _T:
    """A part of the store that exists once it is open (and, for the cache, enabled)."""
    if part is None:
        raise LocalStateError(
            "the store is not open (use `await StateStore.open(...)`), or this call needs the "
            "local cache (enabled=True)"
        )
    return part


async def _open_central(s: Settings) -> Sink:
    url, upgrade = s.resolved_central_url, s.upgrade_schema
    if s.central_thread:
        return await ThreadedSink.open(lambda: CentralStore.open(url, upgrade_schema=upgrade))
    return await CentralStore.open(url, upgrade_schema=upgrade)


def _entry_from(row: CentralRow) -> Entry:
    obj: Any = None
    if row.data is not None:
        value = decode(row.data)
        obj = value if type(value) in IMMUTABLE_TYPES else NOT_DECODED
    return Entry(row.data, obj, row.version, row.updated_at, row.updated_by, row.version)
