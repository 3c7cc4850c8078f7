"""The fleet table: what each triggerer's flushes say about it, for the fleet view and budget.

Each flush records one row for its triggerer (`FleetStatus`) in the flush's own transaction:
on PostgreSQL inside the upsert statement itself (a data-modifying ``WITH``), so it costs no
round trip; on SQLite (in-process, no network) and MySQL (no data-modifying ``WITH``) as a
second statement of the same transaction. The figures are the triggerer's as the flush began:
the dirty keys it carries, the time of the oldest write among them (its lag is the flush time
minus that), the rows per second it has been writing, its flush interval.

Readers (`CentralStore.read_fleet`) get `FleetStatus`es; `lag_and_backlog` turns them into the
view the API, the CLI and the UI show. The backlog a row records is the keys still waiting
once its flush's first batch commits (the keys it carries are not a backlog). A triggerer
whose last flush is older than `STALE_INTERVALS` of its flush intervals is **idle** when that
flush left nothing waiting (it had nothing to write since: a triggerer flushes only what is
dirty) and **stalled** when it left keys waiting (they should have gone out by now);
``stale`` flags the stalled ones only.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from functools import cache
from typing import Any, Final, NamedTuple

from sqlalchemy import TextClause, text

from localstate.sync.schema import FLEET_TABLE

__all__ = [
    "STALE_INTERVALS", "FleetStatus", "fleet_params", "fleet_statement",
    "fleet_summary", "fleet_total_rate", "lag_and_backlog", "this_host", "upsert_with_fleet",
]

#: a triggerer whose last flush is older than this many of its flush intervals is flagged
STALE_INTERVALS: Final = 3.0

_COLUMNS: Final = ("triggerer, host, pid, last_flush_at, dirty_keys, oldest_unflushed_at, "
                   "rows_per_s, flush_interval")
_UPDATE: Final = ("host", "pid", "last_flush_at", "dirty_keys", "oldest_unflushed_at",
                  "rows_per_s", "flush_interval")


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


def _values(dialect: str) -> str:
    if dialect == "postgresql":
        ts = "to_timestamp(CAST({} AS float8))"
    elif dialect in ("mysql", "mariadb"):
        ts = "FROM_UNIXTIME({})"
    else:
        ts = "{}"  # SQLite: the text form, packed by `fleet_params`
    return (f"(:f_id, :f_host, :f_pid, {ts.format(':f_at')}, :f_dirty, "
            f"{ts.format(':f_oldest')}, :f_rate, :f_interval)")


@cache
def fleet_statement(dialect: str) -> TextClause:
    """The fleet row's upsert as a statement of its own."""
    if dialect in ("mysql", "mariadb"):
        sets = ", ".join(f"{c} = VALUES({c})" for c in _UPDATE)
        return text(f"INSERT INTO {FLEET_TABLE} ({_COLUMNS}) VALUES {_values(dialect)} "
                    f"ON DUPLICATE KEY UPDATE {sets}")
    sets = ", ".join(f"{c} = excluded.{c}" for c in _UPDATE)
    return text(f"INSERT INTO {FLEET_TABLE} ({_COLUMNS}) VALUES {_values(dialect)} "
                f"ON CONFLICT (triggerer) DO UPDATE SET {sets}")


@cache
def upsert_with_fleet(dialect: str, upsert: TextClause) -> TextClause | None:
    """`upsert` with the fleet row's upsert in the same statement; None where the dialect
    cannot (the caller runs `fleet_statement` first, in the same transaction)."""
    if dialect != "postgresql":
        return None
    return text(f"WITH fleet AS ({fleet_statement(dialect).text}) {upsert.text}")


def fleet_params(dialect: str, status: FleetStatus,
                 timestamp: Any = None) -> dict[str, Any]:
    """The statement's parameters; `timestamp`: the dialect's packing of a POSIX time
    (SQLite's text form), None where the SQL converts it."""
    at, oldest = status.flushed_at, status.oldest_unflushed
    if timestamp is not None:
        at = timestamp(at)
        oldest = None if oldest is None else timestamp(oldest)
    return {"f_id": status.triggerer, "f_host": status.host, "f_pid": status.pid,
            "f_at": at, "f_dirty": status.dirty_keys, "f_oldest": oldest,
            "f_rate": status.rows_per_s, "f_interval": status.flush_interval}


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
    (`flush_state`) and ``stale``: whether it is stalled."""
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
            "state": state, "stale": state == "stalled",
        })
    return out


def fleet_summary(rows: Sequence[FleetStatus], now: float) -> dict[str, Any]:
    """The whole view: ``triggerers`` (`lag_and_backlog`), ``central_rows_per_s``, and how
    many are ``stale`` (stalled) and ``idle``; what ``/api/v1/fleet`` answers."""
    members = lag_and_backlog(rows, now)
    return {"triggerers": members, "central_rows_per_s": fleet_total_rate(rows, now),
            "stale": sum(1 for m in members if m["stale"]),
            "idle": sum(1 for m in members if m["state"] == "idle")}
