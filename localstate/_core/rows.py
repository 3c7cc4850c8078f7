"""The rows that move between the local cache and a sink.

Named tuples, not dataclasses: a flush builds tens of thousands of them, and a tuple is made in
C (a frozen dataclass pays a Python-level `__setattr__` per field).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Literal, NamedTuple, get_args

__all__ = [
    "HISTORY_KINDS", "CentralRow", "DirtyRow", "EventRow", "EventStatus", "FlushOutcome",
    "HistoryKind", "Resolution", "central_row", "posix_time",
]


class DirtyRow(NamedTuple):
    """A local write the central DB does not hold yet, as taken for one flush."""

    owner: str
    key: str
    #: JSON text; None for a deletion
    data: str | None
    #: the local version being flushed
    version: int
    #: the central version this write was based on: the write may only replace that one
    base_version: int
    updated_at: float
    updated_by: str
    #: the claim epoch its writer held on the owner (`StateStore.claim`); 0: no claim. The
    #: flush refuses it when the owner's central epoch is higher (another writer claimed it)
    epoch: int = 0


class EventRow(NamedTuple):
    """An event emitted with a watermark (`StateStore.emit`), as the outbox holds it."""

    #: its place in the emit order of its local cache file
    seq: int
    owner: str
    #: the idempotency key: the central DB takes one event per (owner, key)
    key: str
    #: JSON text
    payload: str
    created_at: float
    #: the claim epoch its writer held on the owner at the flush (0: none), as `DirtyRow.epoch`
    epoch: int = 0


#: What a flush did with one event: "committed" (new, with its asset events), "duplicate"
#: (its key was committed before: nothing written), "refused" (the owner's claim epoch is
#: higher: a zombie's event, nothing written).
EventStatus = Literal["committed", "duplicate", "refused"]

#: What a row of an owner's history records (`localstate._sync.central.history`): a watermark
#: a flush committed, an event with its outcome, a claim or a release. One list for the table,
#: the REST API's schema and the CLI's ``--kind``.
HistoryKind = Literal["watermark", "event", "claim", "release"]
HISTORY_KINDS: tuple[HistoryKind, ...] = get_args(HistoryKind)


class CentralRow(NamedTuple):
    """A record as the central DB holds it."""

    owner: str
    key: str
    #: JSON text; None when the central record is a deletion
    data: str | None
    version: int
    updated_at: float
    updated_by: str
    #: the local cache file whose sync worker wrote it (`LocalCache.writer_id`); None for any
    #: other write, or when the sink does not say
    writer: str | None = None


#: What a flush did with one dirty row:
#: "written"  the central DB now holds the local value (at `FlushOutcome.row.version`);
#: "adopted"  the central record won: the local one is replaced by `FlushOutcome.row`;
#: "retry"    nothing was decided (a race lost twice): the row stays dirty for the next flush.
Resolution = Literal["written", "adopted", "retry"]


class FlushOutcome(NamedTuple):
    row: DirtyRow
    resolution: Resolution
    #: the central record after the flush (None for "retry")
    central: CentralRow | None
    #: the central version was not the base the write expected (or a max policy refused it)
    conflict: bool = False
    policy: str = ""
    #: for a conflict the local write won: the central record it replaced (`central` is then
    #: the local write itself)
    replaced: CentralRow | None = None
    #: the write was refused because its claim epoch is below the owner's central epoch
    #: (another writer claimed the owner): "adopted", `central` the current record (a
    #: tombstone at version 0 when there is none), `lost_to` that epoch
    lost_to: int = 0


def posix_time(value: datetime | str) -> float:
    """A central timestamp column's value as POSIX time; a value without an offset is UTC (the
    only zone written)."""
    if isinstance(value, str):  # SQLite rows read through text SQL
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:  # SQLite keeps no offset: we always write UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def central_row(row: Sequence[Any]) -> CentralRow:
    """A row of (owner, key, value, version, updated_at, updated_by[, writer])."""
    owner, key, value, version, updated_at, updated_by, *writer = row
    return CentralRow(
        owner, key, value, int(version), posix_time(updated_at),
        updated_by, writer[0] if writer else None,
    )
