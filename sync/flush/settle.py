"""How a flush's outcomes off the common path settle: moved, adopted, conflicted, or lost to
a claim (`Settler`, owned by the `SyncWorker`, which settles the common path itself).

Invariants: the entries change only through the table's settle operations; each central waiter
of a settled write is answered (None: the central DB holds it; else the error its call raises);
`conflicted` holds exactly the keys whose last settled flush met a conflict.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from localstate._cache.entry import Entry, StateKey
from localstate._cache.entry_table import EntryTable
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import CentralRow, DirtyRow, FlushOutcome
from localstate._sync.flush.claims import ClaimBook
from localstate._sync.flush.waiters import FlushWaiters
from localstate.errors import WriteRejected

__all__ = ["ConflictInfo", "FlushReport", "Settler"]

log = logging.getLogger("localstate.sync.worker")  # the worker's log, as before the split


@dataclass(frozen=True)
class ConflictInfo:
    """Passed to the `on_conflict` callback and logged, for each conflict a flush settles."""

    owner: str
    key: str
    policy: str
    #: "local" (the local write went in) or "central" (the central record was kept)
    winner: str
    #: the local write the conflict was about: the refused (or winning) row, or, when the
    #: central record replaced writes made while the flush ran, the latest of those
    local_version: int
    central_version: int
    local_data: str | None
    central_data: str | None


@dataclass
class FlushReport:
    """What one flush did."""

    rows: int = 0
    written: int = 0
    adopted: int = 0
    conflicts: int = 0
    retried: int = 0
    transactions: int = 0
    #: events emitted with watermarks that the flush carried (`StateStore.emit`)
    events: int = 0
    #: clean keys that took a newer central row first (`SyncWorker.refresh_clean`: the first
    #: flush of a file that was not closed cleanly)
    refreshed: int = 0
    duration: float = 0.0
    #: keys still dirty when it finished (written meanwhile, or left to retry)
    still_dirty: int = 0
    #: POSIX time the flush started (before it took its snapshot of the dirty keys)
    started_at: float = 0.0
    outcomes: list[FlushOutcome] = field(default_factory=list, repr=False)


class Settler:
    """Settles one flush outcome at a time into the table and the waiters. The worker's; it
    runs on the event loop's thread, inside `SyncWorker.mark_clean`."""

    def __init__(self, *, table: EntryTable, waiters: FlushWaiters, claims: ClaimBook,
                 policies: PolicyMap, lags: deque[float],
                 on_conflict: Callable[[ConflictInfo], None] | None) -> None:
        self.table = table
        self.waiters = waiters
        self.claims = claims
        self.policies = policies
        #: the worker's flush lags, appended to here for the writes settled off the common path
        self.lags = lags
        self.on_conflict = on_conflict
        #: keys whose last flush met a conflict (the record's flush state says "conflict")
        self.conflicted: set[StateKey] = set()
        #: conflicts settled so far (stats)
        self.conflicts = 0

    def settle(self, o: FlushOutcome, e: Entry, k: StateKey, report: FlushReport,
               now: float) -> None:
        """`SyncWorker.mark_clean` for one outcome off the common path: moved, adopted,
        conflicted, lost to a claim."""
        r = o.row
        table = self.table
        since = table.dirty.get(k)
        central = o.central
        if o.resolution == "retry" or central is None:
            report.retried += 1
            return
        moved = e.version != r.version
        if o.lost_to:
            self._lost(o, e, k, report, central, moved)
            return
        discarded: tuple[int, str | None] | None = None
        if o.resolution == "written":
            report.written += 1
            if moved:
                table.settle_moved(e, central.version)
            else:
                table.settle_written(k, e, central.version)
            self.waiters.settle(k, r.version, None)
        else:
            report.adopted += 1
            if not o.conflict:
                # the central DB holds this cache file's own later write (a flushed version the
                # local file lost in a crash), newer than this row: take it, unless the entry
                # was written again during the flush. Those writes are newer still: they go
                # out next, based on central's record, and their waiters wait for that flush.
                if moved:
                    table.settle_moved(e, central.version)
                    self.waiters.settle(k, r.version, None)
                else:
                    table.settle_adopted(e, central)
                    self.waiters.settle(k, central.version, None)
            elif moved and self.policies.for_owner(r.owner).is_max:
                # newer local writes came in meanwhile: the next flush weighs them
                table.settle_moved(e, central.version)
                self.waiters.settle(k, r.version, _rejected(r, central))
            else:
                if moved:
                    # the writes made during the flush are replaced too: report the latest
                    # of them, not the refused row, so on_conflict names what was discarded
                    discarded = (e.version, e.data)
                table.settle_adopted(e, central)
                self.waiters.settle(k, e.version, _rejected(r, central), every=True)
        if o.conflict:
            report.conflicts += 1
            self._report_conflict(o, central, discarded)
        else:
            self.conflicted.discard(k)
        if o.resolution == "written" and since is not None:
            self.lags.append(max(0.0, now - since))
        table.after_settle(k, e, report.started_at)

    def _lost(self, o: FlushOutcome, e: Entry, k: StateKey, report: FlushReport,
              central: CentralRow, moved: bool) -> None:
        """A write refused for its claim epoch (another writer claimed the owner): the entry
        takes the central record, and the write's waiters get `OwnerLost`."""
        r = o.row
        report.adopted += 1
        lost = self.claims.lose(r.owner, r.epoch, o.lost_to)
        error = self.claims.error(r.owner, o.lost_to)
        if moved and not lost:
            # a write from before this store's claim, which still stands: the writes made
            # since go out next, based on the central record, under the claim
            self.table.settle_moved(e, central.version)
            self.waiters.settle(k, r.version, error)
        else:
            # lost: every write of it this store holds is refused too (they carry the old epoch)
            self.table.settle_adopted(e, central)
            self.waiters.settle(k, e.version, error, every=True)
        self.conflicted.discard(k)
        self.table.after_settle(k, e, report.started_at)

    def _report_conflict(self, o: FlushOutcome, central: CentralRow,
                         discarded: tuple[int, str | None] | None = None) -> None:
        r = o.row
        local_version, local_data = discarded if discarded is not None else (r.version, r.data)
        # when the local write won, report the central record it overwrote, not itself
        central = o.replaced if o.replaced is not None else central
        self.conflicts += 1
        self.conflicted.add((r.owner, r.key))
        info = ConflictInfo(
            owner=r.owner, key=r.key, policy=o.policy,
            winner="local" if o.resolution == "written" else "central",
            local_version=local_version, central_version=central.version,
            local_data=local_data, central_data=central.data,
        )
        log.warning(
            "conflict on %s/%s under %s: the %s record won (local v%d based on v%d, "
            "central v%d by %s)", r.owner, r.key, o.policy, info.winner, local_version,
            r.base_version, central.version, central.updated_by,
        )
        if self.on_conflict is not None:
            try:
                self.on_conflict(info)
            except Exception:
                log.exception("the on_conflict callback failed")


def _rejected(r: DirtyRow, central: CentralRow) -> WriteRejected:
    return WriteRejected(
        f"the central DB kept its record of {r.owner}/{r.key} (v{central.version} by "
        f"{central.updated_by}) over this write (v{r.version} based on v{r.base_version}): "
        "another writer owns it now; read it again before writing"
    )

