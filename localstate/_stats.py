"""`StoreStats`: what `StateStore.stats()` reports, and `store_stats`, which gathers it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localstate._cache.entry_table import EntryTable
    from localstate._cache.local_cache import LocalCache
    from localstate._core.source_figures import SourceFigures
    from localstate._pending_switch import PendingTurnOff
    from localstate._sync.flush.worker import SyncWorker
    from localstate._sync.sinks.read_through import ReadThrough
    from localstate._sync.sinks.sink import Sink

__all__ = ["StoreStats", "store_stats"]


@dataclass(frozen=True)
class StoreStats:
    #: calls since the store opened
    sets: int
    gets: int
    cache_hits: int
    read_through_queries: int
    #: local SQLite commits and the rows they carried
    local_commits: int
    local_rows: int
    rows_per_commit: float
    #: keys the central DB does not hold at their local version
    dirty_keys: int
    #: age in seconds of the oldest write not yet in the central DB (0 when none)
    oldest_unflushed_s: float
    flushes: int
    central_transactions: int
    central_rows: int
    conflicts: int
    central_errors: int
    #: POSIX time of the last successful flush (None: none yet)
    last_flush_at: float | None
    #: seconds from set to central DB, over the recent flushed writes
    flush_lag_p50_s: float | None
    flush_lag_p99_s: float | None
    last_error: str | None
    #: entries held in memory now (at most about max_keys_in_memory, plus the dirty ones)
    keys_in_memory: int
    #: the local cache is in use (local-first mode); False: every call goes to the central DB
    cache_enabled: bool
    #: why the last edit of airflow.cfg was not applied (the settings in force are the last
    #: good ones); None when it was, or when the store does not watch the file
    config_error: str | None = None
    #: clean entries evicted from memory (beyond max_keys_in_memory) since the store opened
    evictions: int = 0
    #: entries dropped from memory by `StateStore.release` (an owner that left)
    released_keys: int = 0
    #: bytes the local cache file and its WAL take on disk now (0 with the cache off)
    cache_file_bytes: int = 0
    #: seconds between flushes now: flush_interval, stretched by central_budget_rows_per_s
    flush_interval_s: float = 0.0
    #: the fleet's rows/s to the central DB at the budget's last reading (None: no budget)
    fleet_rows_per_s: float | None = None
    #: seconds a local commit took, over the recent ones (None: none yet, or the cache off):
    #: a ``local`` set waits for at most the commit in flight and the one carrying it
    local_commit_p50_s: float | None = None
    local_commit_p99_s: float | None = None
    #: ``enabled`` was turned off, but the cache's backlog is not all in the central DB yet:
    #: the store serves from the cache and switches once it is (see `PendingTurnOff`)
    cache_turning_off: bool = False
    #: seconds that turn-off has been pending (0 when none is)
    cache_turning_off_s: float = 0.0
    #: events emitted with watermarks (`StateStore.emit`) since the store opened
    events_emitted: int = 0
    #: events in the outbox now: acknowledged, the central DB does not hold them yet
    events_pending: int = 0
    #: new events the central DB committed (with their watermarks)
    events_committed: int = 0
    #: events whose key the central DB held already (a replay: nothing written twice)
    events_duplicate: int = 0
    #: events of an owner this store lost to another's claim (a zombie's): not written
    events_refused: int = 0
    #: events the central side refused as malformed (dropped from the outbox, logged)
    events_rejected: int = 0
    #: age in seconds of the oldest pending event (0 when none)
    oldest_pending_event_s: float = 0.0
    #: the same figures per owner: {owner: {"emitted", "pending", "committed", "duplicates",
    #: "refused", "rejected", "oldest_pending_at"}}
    events_by_owner: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: queue messages whose event went out flagged (too large, or their route raised) since
    #: the store opened, over its triggers (see the queue guides)
    queue_bad_messages: int = 0
    #: messages the queue watchers are behind their sources' ends (Kafka: each partition's
    #: high watermark), over the store's triggers
    queue_lag: float = 0.0
    #: what each queue watcher reports of its source: {owner: {"bad_messages": n, "lag": n}}
    sources_by_owner: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def store_stats(
    *, table: EntryTable, worker: SyncWorker | None, cache: LocalCache | None,
    sink: Sink | None, reader: ReadThrough | None, hits: int, misses: int,
    cache_enabled: bool, config_error: str | None, turning_off: PendingTurnOff | None = None,
    sources: SourceFigures | None = None,
) -> StoreStats:
    """The figures of a store now, read from its parts (none of them is changed)."""
    w, c = worker, cache
    now = time.time()
    oldest = table.oldest_dirty()
    lags = list(w.lags) if w is not None else []
    commit_s = [s for _, s in c.recent_commits] if c is not None else []
    last_error = (w.last_error if w is not None else None) or (
        c.last_error if c is not None else None)
    return StoreStats(
        sets=table.sets, gets=hits + misses, cache_hits=hits,
        read_through_queries=reader.queries if reader is not None else 0,
        local_commits=c.commits if c else 0, local_rows=c.rows_committed if c else 0,
        rows_per_commit=(c.rows_committed / c.commits) if c and c.commits else 0.0,
        dirty_keys=len(table.dirty),
        oldest_unflushed_s=0.0 if oldest is None else max(0.0, now - oldest),
        flushes=w.flushes if w else 0,
        central_transactions=sink.transactions if sink else 0,
        central_rows=sink.rows_written if sink else 0,
        conflicts=w.conflicts if w else 0,
        central_errors=w.central_errors if w else 0,
        last_flush_at=w.last_flush_at if w else None,
        flush_lag_p50_s=_percentile(lags, 0.5), flush_lag_p99_s=_percentile(lags, 0.99),
        last_error=None if last_error is None else str(last_error),
        keys_in_memory=len(table.entries), cache_enabled=cache_enabled,
        config_error=config_error, evictions=table.evictions,
        released_keys=table.released,
        cache_file_bytes=c.file_bytes if c is not None and not c.closed else 0,
        flush_interval_s=w.interval if w else 0.0,
        fleet_rows_per_s=w.budget.fleet_rows_per_s if w and w.budget else None,
        local_commit_p50_s=_percentile(commit_s, 0.5),
        local_commit_p99_s=_percentile(commit_s, 0.99),
        cache_turning_off=turning_off is not None,
        cache_turning_off_s=turning_off.pending_s if turning_off is not None else 0.0,
        **_event_figures(w, now),
        queue_bad_messages=int(sources.total("bad_messages")) if sources is not None else 0,
        queue_lag=sources.total("lag") if sources is not None else 0.0,
        sources_by_owner=sources.by_owner() if sources is not None else {},
    )


def _event_figures(w: SyncWorker | None, now: float) -> dict[str, Any]:
    if w is None:
        return {}
    owners = {o: asdict(f) for o, f in w.outbox.by_owner().items()}
    oldest = w.outbox.oldest_pending_at()

    def total(name: str) -> int:
        return sum(int(f[name]) for f in owners.values())

    return {"events_emitted": total("emitted"), "events_pending": total("pending"),
            "events_committed": total("committed"), "events_duplicate": total("duplicates"),
            "events_refused": total("refused"), "events_rejected": total("rejected"),
            "oldest_pending_event_s": 0.0 if oldest is None else max(0.0, now - oldest),
            "events_by_owner": owners}


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
