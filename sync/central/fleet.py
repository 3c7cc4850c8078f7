"""The fleet table: what each triggerer's flushes say about it, for the fleet view and budget.

Each flush records one row for its triggerer (`FleetStatus`) in the flush's own transaction: on
PostgreSQL inside the upsert statement itself (a data-modifying ``WITH``), so it costs no round
trip; on SQLite (in-process, no network) and MySQL (no data-modifying ``WITH``) as a second
statement of the same transaction (the statements are `localstate._sync.central.dialects`'). The
figures are the triggerer's as the flush began: the dirty keys it carries, the time of the oldest
write among them (its lag is the flush time minus that), the rows per second it has been writing,
its flush interval.

Readers (`CentralStore.read_fleet`) get `FleetStatus`es; `lag_and_backlog` turns them into the
view the API, the CLI and the UI show. The backlog a row records is the keys still waiting once its
flush's first batch commits (the keys it carries are not a backlog). A triggerer whose last
flush is older than `STALE_INTERVALS` of its flush intervals is **idle** when that flush left
nothing waiting (it had nothing to write since: a triggerer flushes only what is dirty) and
**stalled** when it left keys waiting (they should have gone out by now); ``stalled`` (and
``stale``, its earlier name) flags the stalled ones only.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

__all__ = ["STALE_INTERVALS", "FleetStatus", "fleet_summary", "fleet_total_rate",
           "lag_and_backlog", "this_host"]

#: a triggerer whose last flush is older than this many of its flush intervals is flagged
STALE_INTERVALS: Final = 3.0

class FleetStatus(NamedTuple):
    """One triggerer as a flush reports it."""

    triggerer: str
    host: str
    pid: int
    #: POSIX time of the flush
    flushed_at: float
    dirty_keys: int
    #: POSIX time of the oldest write the flush carries (None: none)
    oldest_unflushed: float | None
    rows_per_s: float
    flush_interval: float



def this_host() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()


def fleet_total_rate(rows: Sequence[FleetStatus], now: float) -> float:
    """The rows per second the live part of the fleet writes (stale triggerers left out)."""
    return sum(r.rows_per_s for r in rows
               if now - r.flushed_at <= STALE_INTERVALS * max(r.flush_interval, 0.001))


def flush_state(since_last_flush: float, backlog: int, flush_interval: float) -> str:
    """"flushing" (a flush within `STALE_INTERVALS` intervals), "idle" (none since, and the
    last one left nothing waiting) or "stalled" (none since, with keys left waiting)."""
    if since_last_flush <= STALE_INTERVALS * flush_interval:
        return "flushing"
    return "stalled" if backlog else "idle"


def lag_and_backlog(rows: Sequence[FleetStatus], now: float) -> list[dict[str, Any]]:
    """The fleet view: each triggerer's figures, its lag at its last flush (seconds from its
    oldest unflushed write to that flush), how long since that flush, its ``state``
    (`flush_state`) and ``stalled`` (also as ``stale``, its earlier name)."""
    out = []
    for r in sorted(rows, key=lambda r: r.triggerer):
        since = max(0.0, now - r.flushed_at)
        lag = 0.0 if r.oldest_unflushed is None else max(0.0, r.flushed_at - r.oldest_unflushed)
        state = flush_state(since, r.dirty_keys, r.flush_interval)
        out.append({
            "triggerer": r.triggerer, "host": r.host, "pid": r.pid,
            "last_flush_at": r.flushed_at, "since_last_flush_s": since,
            "dirty_keys": r.dirty_keys, "oldest_unflushed_at": r.oldest_unflushed,
            "lag_s": lag, "rows_per_s": r.rows_per_s, "flush_interval": r.flush_interval,
            "state": state, "stalled": state == "stalled",
            "stale": state == "stalled",  # the earlier name of "stalled", for old readers
        })
    return out


def fleet_summary(rows: Sequence[FleetStatus], now: float) -> dict[str, Any]:
    """The whole view: ``triggerers`` (`lag_and_backlog`), ``central_rows_per_s``, and how
    many are ``stalled`` (also as ``stale``, its earlier name) and ``idle``; what
    ``/api/v1/fleet`` answers."""
    members = lag_and_backlog(rows, now)
    return {"triggerers": members, "central_rows_per_s": fleet_total_rate(rows, now),
            "stalled": sum(1 for m in members if m["stalled"]),
            "stale": sum(1 for m in members if m["stalled"]),  # the earlier name, as above
            "idle": sum(1 for m in members if m["state"] == "idle")}
