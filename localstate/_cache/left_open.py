"""The local caches a program left open, closed when its interpreter exits.

A cache whose event loop ends through ``asyncio.run`` closes itself then (its writer task is
cancelled, `LocalCache` commits and closes). A loop that is only stopped and closed, as
``loop.run_until_complete(...)`` and Airflow's async tasks do, cancels nothing: such a cache is
still open when the program ends, and so is one whose loop runs on a thread of its own (a
`BlockingStateStore` never closed). Each open cache is tracked here, and an `atexit` hook
closes the ones still open (`LeftOpen.close_at_exit`): what is staged is committed, the file
closed and its lock released, before the interpreter goes.

Tracked per process: a child made by ``fork`` (Airflow's task processes are) starts with an
empty set and a hook of its own, and never touches its parent's caches.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Protocol

__all__ = ["LeftOpen", "track_open", "untrack"]


class LeftOpen(Protocol):
    """What the hook needs of a cache (`LocalCache` has it)."""

    def close_at_exit(self) -> None: ...


class _Tracked:
    """This process's open caches, held weakly: one dropped without close is not kept."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.caches: weakref.WeakSet[LeftOpen] = weakref.WeakSet()
        atexit.register(self.close_all)

    def close_all(self) -> None:
        if self.pid != os.getpid():
            return  # a fork's copy: the parent's caches are not this process's
        raised: Warning | None = None
        for cache in list(self.caches):
            try:
                cache.close_at_exit()
            except Warning as warning:  # an "error" filter: close the others, then raise
                raised = raised or warning
        self.caches.clear()
        if raised is not None:
            raise raised


_tracked: _Tracked | None = None


def track_open(cache: LeftOpen) -> None:
    """Close `cache` at interpreter exit if it is still open then."""
    global _tracked
    if _tracked is None or _tracked.pid != os.getpid():
        _tracked = _Tracked()  # the first open in this process (or in this fork)
    _tracked.caches.add(cache)


def untrack(cache: LeftOpen) -> None:
    """`cache` was closed: nothing left to do for it at exit."""
    if _tracked is not None:
        _tracked.caches.discard(cache)
