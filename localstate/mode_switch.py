"""Applying live settings to a running store: what changed, and the cache toggle.

`open_mode` opens a store's parts and first mode. `StoreCore.reconfigure` takes its
reconfiguring lock and asks `live_changes` what changed. When ``enabled`` turned on, it replaces
its mode with `turned_on` inside its `ModeGate`'s switch (no call in progress meanwhile); when
it turned off, a `PendingTurnOff` flushes the backlog and then replaces the mode with
`turned_off`, inside the switch too. The store keeps the mode and the settings; these functions
only compute the new ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable

from localstate.claims import ClaimBook
from localstate.config import LIVE_SETTINGS, SETTING_NAMES, Settings
from localstate.entry_table import EntryTable
from localstate.errors import CacheLocked, LocalStateError
from localstate.local_first import LocalFirstMode
from localstate.modes import DirectMode, Mode
from localstate.store_parts import StoreParts
from localstate.sync.conflicts import PolicyMap
from localstate.sync.sinks import Sink
from localstate.sync.worker import ConflictInfo

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
    """The first mode of a store opened with the cache off: direct mode, writing under its
    cache file's writer id (the file opened, or created, and kept locked); or local-first
    when the file holds writes the central DB lacks (acknowledged before a restart, or by a
    turn-off that could not finish before the last close). A file that cannot be opened
    (another live process holds it, it is damaged) leaves direct mode without a writer id."""
    try:
        mode = await LocalFirstMode.start(parts, s, keep_clean=False)
    except LocalStateError as exc:
        log.log(logging.INFO if isinstance(exc, CacheLocked) else logging.WARNING,
                "the cache is off and its file %s cannot be used (%s): direct writes carry no "
                "writer id", s.resolved_cache_path, exc)
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
    lock = mode.lock if isinstance(mode, DirectMode) else None
    try:
        return await LocalFirstMode.start(parts, new, keep_clean=False, lock=lock)
    except BaseException:
        if isinstance(mode, DirectMode) and lock is not None and not lock.held:
            # the failed open let the file go: direct mode writes without its id from now on
            with contextlib.suppress(LocalStateError):
                lock.acquire()
            if not lock.held:
                mode.lock, mode.writer = None, None
        raise
