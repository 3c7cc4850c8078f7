"""`Sink`: where the sync worker sends flushes and where read-through reads.

`localstate._sync.central.central_store.CentralStore` (localstate's own table, PostgreSQL or SQLite)
is the sink this package ships; the Airflow integration adds one that goes through Airflow's state
store. A sink takes coalesced batches: one call per flush batch, never one per ``set``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from localstate._cache.entry import StateKey
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import CentralRow, DirtyRow, EventRow, EventStatus, FlushOutcome
from localstate._sync.central.fleet import FleetStatus

__all__ = ["ClaimingSink", "EventSink", "FleetReporting", "ReleaseRecording", "Sink",
           "carries_events", "keeps_versions"]


class Sink(Protocol):
    #: a name for messages and stats (the URL, passwords hidden)
    url: str

    @property
    def transactions(self) -> int:
        """Committed write transactions so far."""

    @property
    def rows_written(self) -> int:
        """Rows those transactions wrote."""

    async def write_batch(
        self, rows: Sequence[DirtyRow], policies: PolicyMap, *, writer: str | None = None
    ) -> list[FlushOutcome]:
        """Write `rows` fenced on their base versions; settle conflicts by policy. One outcome
        per row, in the order of `rows`.

        `writer`: the local cache file the rows come from (`LocalCache.writer_id`): a central
        row carrying it is that file's own chain (see `localstate._sync.central.fenced_write`).
        """

    async def read_many(self, keys: Sequence[StateKey]) -> dict[StateKey, CentralRow]:
        """The central records of `keys` (absent keys are left out)."""

    async def read_owner(self, owner: str) -> list[CentralRow]:
        """Every central record of `owner`, deletions included."""

    async def write_direct(
        self, owner: str, key: str, data: str | None, *, updated_at: float, updated_by: str,
        writer: str | None = None,
    ) -> CentralRow:
        """One write in its own transaction (the cache-off path). `writer`: the writing
        store's id (its cache file's), recorded with the row so that the store's later flushes
        see it as their own chain; None for a writer with no cache file."""

    async def delete_current(self, owner: str, key: str, *, updated_by: str,
                             writer: str | None = None) -> bool:
        """Delete the key's committed value in its own transaction (the cache-off path);
        False when it has none. Of two deletes of one value, one answers True."""

    async def write_if_version(
        self, owner: str, key: str, data: str | None, expected_version: int, *,
        updated_by: str, updated_at: float | None = None, writer: str | None = None,
    ) -> CentralRow:
        """One conditional write in its own transaction (a compare-and-set with the cache off):
        written only if the central record is at `expected_version` (0: it has no value),
        else `VersionConflict`."""

    async def close(self) -> None: ...


@runtime_checkable
class ClaimingSink(Protocol):
    """A sink that holds owners' claim epochs (`localstate._sync.central.fenced_write`); a sink
    without them (Airflow's state store) cannot fence a zombie writer."""

    async def claim(self, owner: str, *, claimant: str, writer: str | None = None,
                    unless_claimed_since: float | None = None) -> int:
        """Bump `owner`'s claim epoch for `claimant` (from the local cache file `writer`) in
        one transaction; the new epoch. With `unless_claimed_since` (POSIX time), only if
        nobody claimed `owner` since then: `OwnerLost` otherwise, nothing changed."""


@runtime_checkable
class ReleaseRecording(Protocol):
    """A sink that records owners' releases in their history (`localstate._sync.central.history`):
    the central store (``sql``) and localstate's app (``api``)."""

    async def record_release(self, owner: str, *, epoch: int, claimant: str,
                             writer: str | None = None) -> bool:
        """Record that `claimant` (from the local cache file `writer`) released `owner`, whose
        claim it held at `epoch`, in one transaction; whether it was (False: the central side
        keeps no history)."""


@runtime_checkable
class FleetReporting(Protocol):
    """A sink that keeps the fleet table (`localstate._sync.central.fleet`)."""

    def note_fleet(self, status: FleetStatus) -> None:
        """Record `status` with the next `write_batch`, in its transaction."""

    async def read_fleet(self) -> list[FleetStatus]:
        """Every triggerer's row of the fleet table."""


@runtime_checkable
class EventSink(Protocol):
    """A sink that commits emitted events with the dirty state in one transaction
    (`StateStore.emit`): the central store (``sql``) and localstate's app (``api``)."""

    async def write_with_events(
        self, rows: Sequence[DirtyRow], events: Sequence[EventRow], policies: PolicyMap, *,
        writer: str | None = None, triggerer: str | None = None,
    ) -> tuple[list[FlushOutcome], list[EventStatus]]:
        """`write_batch` of `rows` and, in the same transaction, `events` in their order: one
        de-duplication row per new (owner, key) and, for an asset's owner, its asset event;
        an event whose claim epoch is below its owner's is refused. One status per event.
        `triggerer`: the writer's triggerer id, for the events' history rows."""


def carries_events(sink: Sink) -> bool:
    """Whether `sink` (or the sink a thread runs for it) commits events (`EventSink`)."""
    inner = getattr(sink, "inner", sink)
    return isinstance(inner, EventSink)


def keeps_versions(sink: Sink) -> bool:
    """Whether `sink` (or the sink a thread runs for it) keeps each row's version, as the
    central store and localstate's app do (they hold claims too); Airflow's state store keeps
    none: its rows read at one fixed version, never newer than a cached entry."""
    inner = getattr(sink, "inner", sink)
    return isinstance(inner, ClaimingSink)
