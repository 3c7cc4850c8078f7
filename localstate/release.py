"""Releasing an owner that left this store (`StateStore.release`).

A trigger that leaves a triggerer (moved, finished, cancelled) has no use for its entries
here any more. Releasing its owner flushes the owner's writes the central DB lacks, waits
until the central DB holds them, then drops the owner's clean entries from memory and their
rows from the local cache file (`EntryTable.release`). What was dropped is read through again
if the owner comes back.

Invariants:

* Nothing acknowledged is lost: an entry is dropped only when the central DB holds exactly
  its version (clean), and never while the sync worker still needs it (a central waiter, a
  conflict whose flush state is still to be read). A write made while the release waits is
  either carried by the flush it waits for (then the central DB holds it) or leaves its
  entry dirty (then it stays, is flushed as usual, and is evicted later like any clean entry).
* The decision to drop is taken synchronously after the waits, with no await in between:
  no write can slip between the check and the drop.
* A read of the owner's keys that began before the drop (a read-through, a load) may return
  a row older than what was dropped: the table's read epoch makes that reader read again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from localstate.entry_table import EntryTable
from localstate.errors import LocalStateError, OwnerLost
from localstate.sync.worker import SyncWorker

__all__ = ["ReleaseReport", "release_owner"]


@dataclass(frozen=True)
class ReleaseReport:
    """What `StateStore.release` did."""

    #: entries dropped from memory and from the local cache file
    dropped: int = 0
    #: entries of the owner still held: written during the release, not flushed within the
    #: timeout (the central DB was down), or in conflict; flushed and evicted as usual
    kept: int = 0
    #: writes the release waited for the central DB to hold, and of those the ones it did not
    #: get within the timeout or that lost a conflict (kept, flushed later)
    flushed: int = 0
    unflushed: int = 0
    #: writes refused for good: another writer claimed the owner (`OwnerLost`), at this epoch
    refused: int = 0
    claimed_at_epoch: int | None = None


async def release_owner(table: EntryTable, worker: SyncWorker, owner: str,
                        timeout: float) -> ReleaseReport:
    """Flush `owner`'s dirty entries (waiting up to `timeout` seconds), then drop the clean
    ones (see the module docstring)."""
    waits = []
    for k in table.keys_of(owner):
        e = table.entries[k]
        version = e.version
        if e.dirty:
            # registered before any await: the flush that carries `version` settles it
            fut = worker.expect_flush(k, version)
            waits.append(worker.wait_flushed(k, version, timeout, fut))
    unflushed = refused = 0
    epoch = None
    if waits:
        for outcome in await asyncio.gather(*waits, return_exceptions=True):
            if isinstance(outcome, OwnerLost):
                refused += 1
                epoch = outcome.current
            elif isinstance(outcome, LocalStateError):
                unflushed += 1  # CentralUnavailable (timeout) or WriteRejected (conflict)
            elif isinstance(outcome, BaseException):
                raise outcome
    dropped, kept = table.release(owner)
    return ReleaseReport(dropped=dropped, kept=kept,
                         flushed=len(waits) - unflushed - refused, unflushed=unflushed,
                         refused=refused, claimed_at_epoch=epoch)
