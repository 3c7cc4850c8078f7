"""`AbsentKeys`: the keys the central DB was read and found to lack, each remembered for
``ttl`` seconds (owned by the `EntryTable`, which asks it before reading a key centrally).

Invariants: a key is absent only until its expiry (monotonic time); expired keys are swept out
once the map has doubled since the last sweep (amortized), so a churn of missing keys leaves no
trail.
"""

from __future__ import annotations

import time
from typing import Final

from localstate.entry import StateKey

__all__ = ["AbsentKeys"]

#: absent keys beyond which `mark` sweeps out the expired ones (amortized)
_ABSENT_SWEEP: Final = 1024


class AbsentKeys:
    """Keys missing centrally, with their expiry. Runs on the event loop's thread."""

    __slots__ = ("_expiry", "_sweep_at", "ttl")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._expiry: dict[StateKey, float] = {}
        self._sweep_at = _ABSENT_SWEEP

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
        if len(expiry) > self._sweep_at:
            self._sweep(now)

    def discard(self, k: StateKey) -> None:
        """`k` has a value now (written, or read from the central DB)."""
        self._expiry.pop(k, None)

    def clear(self) -> None:
        self._expiry.clear()

    def _sweep(self, now: float) -> None:
        """Drop the expired keys (the oldest first: they expire in insertion order, save for a
        key marked again)."""
        expiry = self._expiry
        for k in [k for k, at in expiry.items() if at <= now]:
            del expiry[k]
        self._sweep_at = max(_ABSENT_SWEEP, 2 * len(expiry))
