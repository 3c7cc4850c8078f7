"""Applying live settings to a running store: what changed, and the cache toggle.

`open_mode` opens a store's parts and first mode. `StoreCore.reconfigure` takes its
reconfiguring lock, asks `live_changes` what changed and,
when ``enabled`` did, replaces its mode with `toggled` inside its `ModeGate`'s switch (no call
in progress meanwhile). The store keeps the mode and the settings; these functions only compute
the new ones.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from localstate.claims import ClaimBook
from localstate.config import LIVE_SETTINGS, SETTING_NAMES, Settings
from localstate.entry_table import EntryTable
from localstate.local_first import LocalFirstMode
from localstate.modes import DirectMode, Mode
from localstate.store_parts import StoreParts
from localstate.sync.conflicts import PolicyMap
from localstate.sync.sinks import Sink
from localstate.sync.worker import ConflictInfo

__all__ = ["live_changes", "open_mode", "toggled"]

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
    """Open a store's shared parts and its first mode (``enabled``: local-first, the cache
    file loaded as it is); on an error nothing is left open."""
    parts = await StoreParts.open(s, table=table, sink=sink, policies=policies,
                                  on_conflict=on_conflict, claims=claims)
    try:
        mode: Mode = (await LocalFirstMode.start(parts, s, keep_clean=True) if s.enabled
                      else DirectMode(parts))
    except BaseException:
        await parts.close()
        raise
    return parts, mode


async def toggled(mode: Mode, parts: StoreParts, new: Settings) -> Mode:
    """The mode that replaces `mode` when ``enabled`` changes to ``new.enabled``.

    Turning the cache off flushes every dirty key first, then closes the cache and empties
    the table and file; when that fails, `mode` is left running and the error raised.
    """
    if new.enabled:
        return await LocalFirstMode.start(parts, new, keep_clean=False)
    if not isinstance(mode, LocalFirstMode):
        raise TypeError(f"turning the cache off from {type(mode).__name__}")
    await mode.drain_and_stop(new.close_timeout)
    return DirectMode(parts)
