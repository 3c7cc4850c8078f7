"""What the API reads of the serving `StateStore` beyond its public calls, in one place.

The list and single reads show the central DB (the truth every triggerer flushes to). Asked for
with ``?pending=true``, they overlay the serving store's own unfinished business: a key the
store holds *dirty* (a write the central DB lacks, which may yet be refused) or whose last
flush met a *conflict* is shown as the store holds it, marked by that flush state. Everything
else is shown as the central DB holds it, ``flushed``. Other triggerers' dirty writes live in
their own caches and show once flushed.

The store's unfinished business comes from `StateStore.unflushed` (no query, O(page + dirty
keys)).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from localstate._cache.entry import Entry, StateKey
from localstate._core.codec import decode
from localstate._core.model import FlushState, epoch_to_datetime
from localstate._core.rows import CentralRow
from localstate._store import StateStore

__all__ = ["Item", "item_from_row", "local_override", "local_overrides"]


@dataclass(frozen=True)
class Item:
    """One state variable as the API shows it; `deleted` marks a local tombstone."""

    owner: str
    key: str
    value: object
    version: int
    updated_at: datetime
    updated_by: str
    flush_state: str
    deleted: bool = False

    @property
    def name(self) -> StateKey:
        return (self.owner, self.key)


def item_from_row(row: CentralRow) -> Item:
    return Item(row.owner, row.key, None if row.data is None else decode(row.data), row.version,
                epoch_to_datetime(row.updated_at), row.updated_by, FlushState.FLUSHED.value,
                deleted=row.data is None)


def _item_from_entry(k: StateKey, e: Entry, state: FlushState) -> Item:
    return Item(k[0], k[1], None if e.data is None else decode(e.data), e.version,
                epoch_to_datetime(e.updated_at), e.updated_by, state.value,
                deleted=e.data is None)


def local_overrides(store: StateStore, prefixes: tuple[str, ...],
                    after: StateKey | None) -> dict[StateKey, Item]:
    """Dirty or conflicted keys of the store under `prefixes`, after the cursor `after`."""
    out: dict[StateKey, Item] = {}
    for k, e, state in store.unflushed():
        if after is not None and k <= after:
            continue
        if not any(k[0].startswith(p) for p in prefixes):
            continue
        out[k] = _item_from_entry(k, e, state)
    return out


def local_override(store: StateStore, k: StateKey) -> Item | None:
    """The store's own version of `k` when it is dirty or in conflict, else None."""
    for _, e, state in store.unflushed([k]):
        return _item_from_entry(k, e, state)
    return None
