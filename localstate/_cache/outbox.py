"""`Outbox`: the events a store emitted with their watermarks, until the central DB holds them.

`StateStore.emit` adds an event here (`add`) and stages it in the local cache file's ``outbox``
table *before* the watermark write it goes with: the cache's writer commits both in one SQLite
transaction (or the event in an earlier one), so a watermark is never on disk without its
event. The sync worker takes a snapshot of the pending events with each flush (`pending`), in
emit order, and the sink commits them with the dirty state in one central transaction; the
worker then records what became of each (`settle`), which drops it from the file.

An event committed twice (a flush whose answer was lost, replayed; a trigger that re-emits an
item after a restart) is de-duplicated centrally by ``(owner, key)``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from localstate._cache.local_cache import LocalCache
from localstate._core.rows import EventRow, EventStatus

__all__ = ["Outbox", "OwnerEvents"]


@dataclass(slots=True)
class OwnerEvents:
    """One owner's event figures since the store opened (`pending`: in the outbox now)."""

    emitted: int = 0
    pending: int = 0
    committed: int = 0
    duplicates: int = 0
    refused: int = 0
    #: events the central side refused as malformed (its limits are stricter than this
    #: store's): dropped from the outbox, each logged as an error, so the rest goes on
    rejected: int = 0
    #: POSIX time of the oldest pending event (None: none pending)
    oldest_pending_at: float | None = None


class Outbox:
    """The pending events of one local cache file, in emit order; the only code that changes
    them (the file's ``outbox`` table follows through the cache's writer)."""

    def __init__(self, cache: LocalCache, loaded: Sequence[EventRow] = ()) -> None:
        self.cache = cache
        self._pending: dict[int, EventRow] = {e.seq: e for e in loaded}
        self._next_seq = max(self._pending, default=0) + 1
        self._owners: dict[str, OwnerEvents] = {}
        for e in loaded:
            self._figures(e.owner).pending += 1

    def __len__(self) -> int:
        return len(self._pending)

    def _figures(self, owner: str) -> OwnerEvents:
        figures = self._owners.get(owner)
        if figures is None:
            figures = self._owners[owner] = OwnerEvents()
        return figures

    def add(self, owner: str, key: str, payload: str) -> EventRow:
        """Append an event (JSON text `payload`) and stage it for the cache file's next commit."""
        event = EventRow(self._next_seq, owner, key, payload, time.time())
        self._next_seq += 1
        self._pending[event.seq] = event
        self.cache.stage_event(event)
        figures = self._figures(owner)
        figures.emitted += 1
        figures.pending += 1
        return event

    def pending(self) -> list[EventRow]:
        """A snapshot of the pending events, in emit order."""
        return list(self._pending.values())

    def settle(self, events: Sequence[EventRow], statuses: Sequence[EventStatus]) -> None:
        """Record what a committed flush did with `events` and drop them from the outbox."""
        for e, status in zip(events, statuses, strict=True):
            if self._pending.pop(e.seq, None) is None:
                continue
            figures = self._figures(e.owner)
            figures.pending -= 1
            if status == "committed":
                figures.committed += 1
            elif status == "duplicate":
                figures.duplicates += 1
            else:
                figures.refused += 1
        self.cache.drop_events([e.seq for e in events])

    def reject(self, event: EventRow) -> None:
        """Drop `event`, which the central side refused as malformed, from the outbox."""
        if self._pending.pop(event.seq, None) is None:
            return
        figures = self._figures(event.owner)
        figures.pending -= 1
        figures.rejected += 1
        self.cache.drop_events([event.seq])

    def oldest_pending_at(self) -> float | None:
        """POSIX time of the oldest pending event (None: none)."""
        first = next(iter(self._pending.values()), None)
        return None if first is None else first.created_at

    def pending_of(self, owner: str) -> int:
        """How many of `owner`'s events are in the outbox now (not in the central DB yet)."""
        figures = self._owners.get(owner)
        return 0 if figures is None else figures.pending

    def by_owner(self) -> dict[str, OwnerEvents]:
        """Each owner's figures (a copy), the age of its oldest pending event included."""
        oldest: dict[str, float] = {}
        for e in self._pending.values():
            oldest.setdefault(e.owner, e.created_at)
        return {o: OwnerEvents(f.emitted, f.pending, f.committed, f.duplicates, f.refused,
                               f.rejected, oldest.get(o))
                for o, f in self._owners.items()}
