"""`OwnerIndex`: the keys an `EntryTable` holds, grouped by owner, and the per-owner drop
epochs its central reads check (owned by the table, changed only through it).

Invariants: ``by_owner`` holds exactly the keys of the table's entries, grouped by owner (a
release finds an owner's keys without a scan); an owner's `drop_epoch` moves with every release
of an owner that hashes to the same one of `_EPOCH_SLOTS` slots, so a release rarely sends
another owner's read round again.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from localstate._cache.entry import StateKey

__all__ = ["OwnerIndex"]

#: slots of the per-owner drop epochs (a power of two: a mask picks the slot)
_EPOCH_SLOTS: Final = 256


class OwnerIndex:
    """Keys by owner, and drop epochs. Runs on the event loop's thread."""

    __slots__ = ("_drop_epochs", "by_owner")

    def __init__(self) -> None:
        self.by_owner: dict[str, set[str]] = {}
        self._drop_epochs = [0] * _EPOCH_SLOTS

    def add(self, owner: str, key: str) -> None:
        keys = self.by_owner.get(owner)
        if keys is None:
            self.by_owner[owner] = {key}
        else:
            keys.add(key)

    def reset(self, keys: Iterable[StateKey]) -> None:
        """Index exactly `keys` (the table's entries were replaced)."""
        self.by_owner.clear()
        for owner, key in keys:
            self.add(owner, key)

    def remove(self, keys: Iterable[StateKey]) -> None:
        """`keys` left the table."""
        by_owner = self.by_owner
        for owner, key in keys:
            held = by_owner[owner]
            held.discard(key)
            if not held:
                del by_owner[owner]

    def keys_of(self, owner: str) -> list[StateKey]:
        """The keys of `owner` held now."""
        return [(owner, key) for key in self.by_owner.get(owner, ())]

    def drop_epoch(self, owner: str) -> int:
        """A number that moves whenever `owner` (or one sharing its slot) is released."""
        return self._drop_epochs[hash(owner) & (_EPOCH_SLOTS - 1)]

    def released(self, owner: str) -> None:
        """Entries of `owner` were just dropped by a release."""
        self._drop_epochs[hash(owner) & (_EPOCH_SLOTS - 1)] += 1
