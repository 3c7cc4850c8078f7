"""Applying live settings to a running store: what changed, and the cache toggle.

`open_mode` opens a store's parts and first mode. `StoreCore.reconfigure` takes its
reconfiguring lock and asks `live_changes` what changed. When ``enabled`` turned on, it replaces
its mode with `turned_on` inside its `ModeGate`'s switch (no call in progress meanwhile); when
it turned off, a `PendingTurnOff` flushes the backlog and then replaces the mode with
`turned_off`, inside the switch too. The store keeps the mode and the settings; these functions
only compute the new ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable

from localstate.config import Settings
from localstate.conflicts import PolicyMap
from localstate.entry_table import EntryTable
from localstate.errors import CacheLocked, LocalStateError
from localstate.local_first import LocalFirstMode
from localstate.modes import DirectMode, Mode
from localstate.setting_specs import LIVE_SETTINGS, SETTING_NAMES
from localstate.store_parts import StoreParts
from localstate.sync.claims import ClaimBook
from localstate.sync.settle import ConflictInfo
from localstate.sync.sinks import Sink

__all__ = ["direct_or_backlog", "live_changes", "open_mode", "turned_off", "turned_on"]

# the store's logger: what reconfigure logs is the store's, wherever the code lives
log = logging.getLogger("localstate.store")


def live_changes(current: Settings, settings: Settings) -> tuple[tuple[str, ...], Settings]:
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


async def open_mode(
    s: Settings, *, table: EntryTable, sink: Sink | None, policies: PolicyMap,
    on_conflict: Callable[[ConflictInfo], None] | None, claims: ClaimBook,
) -> tuple[StoreParts, Mode]:
    """Open a store's shared parts and its first mode; on an error nothing is left open.

    ``enabled``: local-first, the cache file loaded as it is. Cache off: direct mode, except
    that the cache file is opened first (`direct_or_backlog`): a file still holding writes the
    central DB lacks starts the store local-first, for the store to turn the cache off once
    they are flushed (a `PendingTurnOff`)."""
    parts = await StoreParts.open(s, table=table, sink=sink, policies=policies,
                                  on_conflict=on_conflict, claims=claims)
    try:
        mode: Mode = (await LocalFirstMode.start(parts, s, keep_clean=True) if s.enabled
                      else await direct_or_backlog(parts, s))
    except BaseException:
        await parts.close()
        raise
    return parts, mode


async def direct_or_backlog(parts: StoreParts, s: Settings) -> Mode:
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
    return await turned_off(mode, parts, s.close_timeout)


async def turned_off(mode: LocalFirstMode, parts: StoreParts, timeout: float) -> DirectMode:
    """Turn the cache off: flush every dirty key (within `timeout` s), close the cache and
    empty the table and file, and return the direct mode that writes under the file's id.

    When that flush fails, `mode` is left running and the error raised (`CentralUnavailable`).
    """
    writer = mode.cache.writer_id
    lock = await mode.drain_and_stop(timeout)
    return DirectMode(parts, lock, writer)


async def turned_on(mode: Mode, parts: StoreParts, new: Settings) -> Mode:
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
