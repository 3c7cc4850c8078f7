"""`AbsentKeys`: the keys the central DB was read and found to lack, each remembered for
``ttl`` seconds (owned by the `EntryTable`, which asks it before reading a key centrally).

It also keeps, beyond the ``ttl``, the keys this store *last saw* absent (`seen_absent`): no
version of such a key has been shown by this store since (a write or a read of it discards
it). A first write of one, whose central base is not known, is numbered from 0 (version 1)
rather than from the clock (`EntryTable.first_write_base`): the versions this store shows for
it still never go down, and a fresh key does not start at 1.8·10¹⁵.

Invariants: a key is absent only until its expiry (monotonic time); expired keys are swept out
once the map has doubled since the last sweep (amortized), so a churn of missing keys leaves no
trail; at most `seen_cap` keys are kept as last seen absent (the oldest are dropped first).
"""

from __future__ import annotations

import time
from typing import Final

from localstate._cache.entry import StateKey

__all__ = ["AbsentKeys"]

#: absent keys beyond which `mark` sweeps out the expired ones (amortized)
_ABSENT_SWEEP: Final = 1024


class AbsentKeys:
    """Keys missing centrally, with their expiry. Runs on the event loop's thread."""

    __slots__ = ("_expiry", "_seen", "_sweep_at", "seen_cap", "ttl")

    def __init__(self, ttl: float, seen_cap: int = 100_000) -> None:
        self.ttl = ttl
        self._expiry: dict[StateKey, float] = {}
        self._sweep_at = _ABSENT_SWEEP
        self._seen: dict[StateKey, None] = {}  # insertion-ordered: the oldest first
        self.seen_cap = seen_cap

    def seen_absent(self, k: StateKey) -> bool:
        """Whether this store last saw `k` absent centrally, however long ago (see the
        module docstring)."""
        return k in self._seen

    def __contains__(self, k: StateKey) -> bool:
        """Whether `k` was found missing centrally less than ``ttl`` seconds ago."""
        expiry = self._expiry.get(k)
        if expiry is None:
            return False
        if expiry > time.monotonic():
            return True
        del self._expiry[k]
        return False

    def mark(self, k: StateKey) -> None:
        """`k` was just found missing centrally."""
        expiry = self._expiry
        now = time.monotonic()
        expiry[k] = now + self.ttl
        seen = self._seen
        seen.pop(k, None)
        seen[k] = None
        if len(seen) > self.seen_cap:
            del seen[next(iter(seen))]
        if len(expiry) > self._sweep_at:
            self._sweep(now)

    def discard(self, k: StateKey) -> None:
        """`k` has a value now (written, or read from the central DB)."""
        self._expiry.pop(k, None)
        self._seen.pop(k, None)

    def clear(self) -> None:
        self._expiry.clear()
        self._seen.clear()

    def _sweep(self, now: float) -> None:
        """Drop the expired keys (the oldest first: they expire in insertion order, save for a
        key marked again)."""
        expiry = self._expiry
        for k in [k for k, at in expiry.items() if at <= now]:
            del expiry[k]
        self._sweep_at = max(_ABSENT_SWEEP, 2 * len(expiry))
