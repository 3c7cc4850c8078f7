"""`StoreStats`: what `StateStore.stats()` reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["StoreStats"]


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
