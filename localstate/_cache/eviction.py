"""The eviction scan of an `EntryTable`'s bounded working set (``max_keys_in_memory``): which
clean entries leave memory. The table owns the maps and calls `second_chance_scan`; nothing
else evicts.

Invariants: eviction is amortized: a pass runs when the map has grown by a tenth since the last
one (`grown`), or after a flush above ``max_keys`` and a tenth, never per write. Recency is a
second-chance bit (``Entry.used``, set by every hit, and for a write when its flush settles
it, since a dirty entry stays anyway): a pass scans from the oldest key, moves a used one to
the end with its bit cleared, and evicts an unused clean one. Only clean entries that nothing
pins are taken.
"""

from __future__ import annotations

from collections.abc import Callable

from localstate._cache.entry import Entry, StateKey

__all__ = ["grown", "second_chance_scan"]


def second_chance_scan(entries: dict[StateKey, Entry], dirty: dict[StateKey, float],
                       pinned: Callable[[StateKey], bool], excess: int) -> dict[StateKey, Entry]:
    """Take up to `excess` clean, unpinned entries out of `entries` (in place) and return them.

    One pass from the oldest key, each entry looked at once at most: a used one gets its
    second chance (moved to the end, bit cleared), a dirty or pinned one stays where it is.
    """
    gone: dict[StateKey, Entry] = {}
    if excess <= 0:
        return gone
    for k in list(entries):
        e = entries[k]
        if e.used:
            e.used = False
            del entries[k]
            entries[k] = e  # to the end: the most recently used
        elif e.version == e.synced_version and k not in dirty and not pinned(k):
            gone[k] = entries.pop(k)
            if len(gone) == excess:
                return gone
    # every unused one is gone: the oldest used ones go next
    for k in list(entries):
        e = entries[k]
        if e.version == e.synced_version and k not in dirty and not pinned(k):
            gone[k] = entries.pop(k)
            if len(gone) == excess:
                break
    return gone


def grown(n: int) -> int:
    """The size at which a map of `n` keys is due another eviction pass."""
    return n + max(1, n // 10)
