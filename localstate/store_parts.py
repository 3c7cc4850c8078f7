"""Opening, wiring and releasing the parts of a `StateStore`.

The parts: the sink to the central DB, the read-through in front of it and, in local-first mode,
the local cache with the sync worker that flushes it. They stay attributes of the store (the hot
path reads them there, one attribute lookup each); these functions only set them up and tear
them down.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from localstate.config import Settings, config_file_path
from localstate.errors import LocalStateError, StoreClosed
from localstate.local_cache import LocalCache
from localstate.metrics import start_reporter
from localstate.sync.asset_mirror import AssetMirror
from localstate.sync.central_store import CentralStore
from localstate.sync.read_through import ReadThrough
from localstate.sync.sink_thread import ThreadedSink
from localstate.sync.sinks import Sink
from localstate.sync.worker import SyncWorker

if TYPE_CHECKING:
    from localstate.store import StateStore

__all__ = ["open_central", "open_parts", "release", "require_open", "start_cache"]

# the store's logger: what it logs while opening is the store's, wherever the code lives
log = logging.getLogger("localstate.store")

_T = TypeVar("_T")


async def open_parts(store: StateStore) -> None:
    """Open `store` (once): its sink, read-through, cache and worker, metrics and watcher."""
    if store._opened:
        if store._closed:
            raise StoreClosed("this store was closed; open a new StateStore")
        return
    s = store.settings
    try:
        if store._sink is None:
            store._sink = await open_central(s)
        store._reader = ReadThrough(store._sink)
        if not store._direct:
            await start_cache(store, s, keep_clean=True)
    except BaseException:
        await release(store)
        raise
    store._opened = True
    store._metrics = start_reporter(store)
    if s.watch_config:
        from localstate.reload import ConfigWatcher

        store._watcher = ConfigWatcher(store, config_file_path())
        try:
            await store._watcher.start()
        except BaseException:
            await store.close()
            raise


async def start_cache(store: StateStore, s: Settings, *, keep_clean: bool) -> None:
    """Open the local cache, load it into the store's entry table and start the sync worker.

    `keep_clean=False` (the cache turned on at run time): see `EntryTable.fill`.
    """
    store._cache = cache = await LocalCache.open(
        s.resolved_cache_path,
        owner_id=store.triggerer_id,
        local_sync="normal" if s.local_sync == "normal" else "full",
        memory_window=s.memory_window,
    )
    entries = await cache.load()
    table = store._table
    store._worker = worker = SyncWorker(
        table=table, cache=cache,
        sink=store._require_sink(), policies=store._policies,
        flush_interval=s.flush_interval, max_batch=s.max_batch,
        on_conflict=store._on_conflict,
    )
    table.fill(cache, entries, keep_clean=keep_clean, on_full=worker.kick,
               pinned=worker.holds)
    worker.start()
    if table.dirty:
        log.info("%d writes not yet in the central DB found in %s; flushing",
                 len(table.dirty), cache.path)
        worker.kick()


async def release(store: StateStore) -> None:
    """Close the cache, the read-through and (when the store opened it) the sink."""
    if store._cache is not None:
        await store._cache.close()
    if store._reader is not None:
        await store._reader.close()
    if store._sink is not None and store._owns_sink:
        await store._sink.close()


async def open_central(s: Settings) -> Sink:
    """The sink to the central DB that the settings `s` name."""
    if s.sink == "airflow":
        # Airflow's state store through the triggerer's accessors: they talk over the trigger
        # loop's comms, so this sink runs on the loop the store was opened on, not a thread
        from localstate.sync.airflow_sink import process_sink

        return process_sink()
    if s.sink == "api":
        # a localstate API server over HTTP: no database credentials in this process
        from localstate.sync.api_sink import ApiSink

        return (await ThreadedSink.open(lambda: ApiSink.open(s)) if s.central_thread
                else await ApiSink.open(s))
    url, upgrade = s.resolved_central_url, s.upgrade_schema

    async def opened() -> CentralStore:
        # the store starts during a central outage: it serves its cache and flushes later
        central = await CentralStore.open(url, upgrade_schema=upgrade, defer_if_unreachable=True)
        central.asset_mirror = None if s.asset_mirror == "off" else AssetMirror(s.asset_mirror)
        return central

    if s.central_thread:
        return await ThreadedSink.open(opened)
    return await opened()


def require_open(part: _T | None) -> _T:
    """A part of the store that exists once it is open (and, for the cache, enabled)."""
    if part is None:
        raise LocalStateError(
            "the store is not open (use `await StateStore.open(...)`), or this call needs the "
            "local cache (enabled=True)"
        )
    return part
