"""Applying live settings to a running `StateStore`, the cache toggle included.

`StateStore.reconfigure` checks the call and takes the store's reconfiguring lock; then
`apply_live_settings` compares, switches between local-first and direct mode through the store's
`ModeGate` when ``enabled`` changed, and retunes the sync worker. The store's state stays on the
store (its hot path reads it there); these functions change it only inside the gate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from localstate.config import LIVE_SETTINGS, SETTING_NAMES, Settings
from localstate.errors import CentralUnavailable
from localstate.store_parts import start_cache
from localstate.sync.worker import SyncWorker

if TYPE_CHECKING:
    from localstate.store import StateStore

__all__ = ["apply_live_settings"]

# the store's logger: what reconfigure logs is the store's, wherever the code lives
log = logging.getLogger("localstate.store")


async def apply_live_settings(store: StateStore, settings: Settings) -> tuple[str, ...]:
    """The body of `StateStore.reconfigure` (under its lock): apply, return what changed."""
    current = store.settings
    changed = tuple(n for n in LIVE_SETTINGS if getattr(settings, n) != getattr(current, n))
    later = [n for n in SETTING_NAMES
             if n not in LIVE_SETTINGS and getattr(settings, n) != getattr(current, n)]
    if later:
        log.warning("setting(s) %s changed; they apply when the store next starts (live: "
                    "%s)", ", ".join(later), ", ".join(LIVE_SETTINGS))
    if not changed:
        return ()
    new = dataclasses.replace(
        current, **{n: getattr(settings, n) for n in changed},
        sources={**current.sources,
                 **{n: settings.sources.get(n, "default") for n in changed}},
    )
    toggle = new.enabled == store._direct
    async with store._gate.switch() if toggle else store._gate.exclusive():
        if store._closed:
            raise store._closed_error()
        if toggle and new.enabled:
            await _go_local(store, new)
        elif toggle:
            await _go_direct(store)
        store._durability = new.durability
        store._table.kick_at = new.max_batch
        if store._worker is not None:
            store._worker.retune(flush_interval=new.flush_interval, max_batch=new.max_batch)
        store.settings = new
    log.info("applied %s", ", ".join(f"{n}={getattr(new, n)!r}" for n in changed))
    return changed


async def _go_local(store: StateStore, s: Settings) -> None:
    """Direct mode to local-first (within a gate switch: no call is in progress)."""
    try:
        await start_cache(store, s, keep_clean=False)
    except BaseException:
        worker, cache = store._worker, store._cache
        store._worker = store._cache = None
        store._table.forget_all(purge=False)
        if worker is not None:
            await worker.stop(0)
        if cache is not None:
            await cache.close()
        raise
    store._direct = False


async def _go_direct(store: StateStore) -> None:
    """Local-first to direct mode: flush everything first (within a gate switch)."""
    worker, cache = store._require_worker(), store._require_cache()
    store._direct = True  # from here every call, hot path included, waits at the gate
    timeout = store.settings.close_timeout
    try:
        await asyncio.wait_for(_drain(store, worker), timeout)
    except BaseException as exc:
        store._direct = False  # stay local-first: nothing was lost, nothing changed
        if isinstance(exc, asyncio.TimeoutError):
            raise CentralUnavailable(
                f"could not flush {len(store._table.dirty)} dirty keys to {worker.sink.url} "
                f"within {timeout:g} s (close_timeout) to turn the cache off; it stays on"
            ) from None
        raise
    await worker.stop(timeout)  # nothing is dirty: this only ends its loop
    # The central DB holds every row now: empty the file, so that turning the cache on
    # again (or the next start) cannot serve a value written centrally meanwhile.
    store._table.forget_all(purge=True)
    await cache.close()
    store._worker = store._cache = None


async def _drain(store: StateStore, worker: SyncWorker) -> None:
    while store._table.dirty:
        await worker.flush()
