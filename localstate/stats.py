"""`StoreStats`: what `StateStore.stats()` reports, and `store_stats`, which gathers it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localstate.store import StateStore

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
    keys_in_memory: int
    cache_enabled: bool
    #: why the last edit of airflow.cfg was not applied (the settings in force are the last
    #: good ones); None when it was, or when the store does not watch the file
    config_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def store_stats(store: StateStore) -> StoreStats:
    """The figures of `store` now, read from its parts (none of them is changed)."""
    w, c, sink = store._worker, store._cache, store._sink
    now = time.time()
    oldest = min(store._dirty.values(), default=None)
    lags = list(w.lags) if w is not None else []
    last_error = (w.last_error if w is not None else None) or (
        c.last_error if c is not None else None)
    return StoreStats(
        sets=store._sets, gets=store._hits + store._misses, cache_hits=store._hits,
        read_through_queries=store._reader.queries if store._reader is not None else 0,
        local_commits=c.commits if c else 0, local_rows=c.rows_committed if c else 0,
        rows_per_commit=(c.rows_committed / c.commits) if c and c.commits else 0.0,
        dirty_keys=len(store._dirty),
        oldest_unflushed_s=0.0 if oldest is None else max(0.0, now - oldest),
        flushes=w.flushes if w else 0,
        central_transactions=sink.transactions if sink else 0,
        central_rows=sink.rows_written if sink else 0,
        conflicts=w.conflicts if w else 0,
        central_errors=w.central_errors if w else 0,
        last_flush_at=w.last_flush_at if w else None,
        flush_lag_p50_s=_percentile(lags, 0.5), flush_lag_p99_s=_percentile(lags, 0.99),
        last_error=None if last_error is None else str(last_error),
        keys_in_memory=len(store._entries), cache_enabled=not store._direct,
        config_error=store._watcher.last_error if store._watcher is not None else None,
    )


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
