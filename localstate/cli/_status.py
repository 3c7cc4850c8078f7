"""status: the central DB (rows, writers, last writes) and the cache files on this host (rows
not yet flushed, the oldest unflushed write, who holds each)."""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localstate.cli._cache_files import cache_files, cache_folder, cache_summary
from localstate.cli._central import open_central, settings_for
from localstate.cli._exit_codes import EXIT_ERROR
from localstate.cli._printing import human_time, print_json
from localstate.errors import CentralError, SchemaError
from localstate.sync.fleet import STALE_INTERVALS, fleet_total_rate, lag_and_backlog
from localstate.sync.schema import LATEST_VERSION
from localstate.version import __version__

if TYPE_CHECKING:
    from localstate.sync.central_store import CentralStore

__all__ = ["cmd_status"]


def _ago(ts: float | None) -> str:
    if ts is None:
        return "-"
    s = max(0.0, time.time() - ts)
    if s < 120:
        return f"{s:.1f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    return f"{s / 3600:.1f} h ago"


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return float(value.timestamp())


async def _central_summary(central: CentralStore) -> dict[str, Any]:
    from sqlalchemy import case, func, select
    from sqlalchemy.exc import SQLAlchemyError

    from localstate.sync.engine import read_connection
    from localstate.sync.schema import current_version, state_variable

    t = state_variable.c
    totals = select(func.count(), func.count(func.distinct(t.owner)),
                    func.sum(case((t.value.is_(None), 1), else_=0)), func.max(t.updated_at))
    writers = (select(t.updated_by, func.count(), func.max(t.updated_at))
               .group_by(t.updated_by).order_by(func.max(t.updated_at).desc()).limit(50))
    try:
        async with read_connection(central.engine) as conn:
            schema = await current_version(conn)
            rows, owners, deleted, last = (await conn.execute(totals)).one()
            by_writer = (await conn.execute(writers)).all()
    except SQLAlchemyError as exc:
        raise CentralError(f"cannot read the central DB {central.url}: {exc}") from exc
    return {
        "url": central.url, "schema_version": schema, "rows": int(rows or 0),
        "owners": int(owners or 0), "deleted": int(deleted or 0),
        "last_write_at": _epoch(last),
        "writers": [{"updated_by": w, "rows": int(n), "last_write_at": _epoch(at)}
                    for w, n, at in by_writer],
    }


def _print_fleet(fleet: dict[str, Any]) -> None:
    members = fleet["triggerers"]
    print(f"fleet         {len(members)} triggerers, {fleet['central_rows_per_s']:.1f} rows/s "
          f"to the central DB, {fleet['stale']} stale")
    if not members:
        return
    width = max(10, *(len(m["triggerer"]) for m in members))
    print(f"{'TRIGGERER':<{width}}  {'HOST:PID':<20}  {'LAST FLUSH':<14}  {'BACKLOG':>7}  "
          f"{'LAG':>8}  {'ROWS/S':>8}  {'INTERVAL':>8}")
    for m in members:
        flag = f"  STALE: no flush for over {STALE_INTERVALS:g} intervals" if m["stale"] else ""
        print(f"{m['triggerer']:<{width}}  {m['host'] + ':' + str(m['pid']):<20}  "
              f"{_ago(m['last_flush_at']):<14}  {m['dirty_keys']:>7}  {m['lag_s']:>7.2f}s  "
              f"{m['rows_per_s']:>8.1f}  {m['flush_interval']:>7.2f}s{flag}")


async def _fleet(central: CentralStore) -> dict[str, Any]:
    now = time.time()
    rows = await central.read_fleet()
    members = lag_and_backlog(rows, now)
    return {"triggerers": members, "central_rows_per_s": fleet_total_rate(rows, now),
            "stale": sum(1 for m in members if m["stale"])}


async def _older_schema(url: str) -> int | None:
    """The central DB's schema version when it is older than this release's, else None."""
    from localstate.sync.engine import make_engine, read_connection
    from localstate.sync.schema import current_version

    engine = make_engine(url)
    try:
        async with read_connection(engine) as conn:
            version = await current_version(conn)
    finally:
        await engine.dispose()
    return version if version < LATEST_VERSION else None


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    if args.fleet:
        async def fleet() -> dict[str, Any]:
            async with open_central(settings, read_only=True) as central:
                return await _fleet(central)

        view = asyncio.run(fleet())
        if args.json:
            print_json({"fleet": view})
        else:
            _print_fleet(view)
        return 0

    async def go() -> dict[str, Any]:
        async with open_central(settings, read_only=True) as central:
            return await _central_summary(central)

    try:
        central = asyncio.run(go())
    except SchemaError:
        behind = asyncio.run(_older_schema(settings.resolved_central_url))
        if behind is None:
            raise
        print(f"localstate    {__version__}")
        print(f"central DB    schema {behind}, needs upgrade: run `localstate db upgrade` "
              f"(this release uses schema {LATEST_VERSION})")
        return EXIT_ERROR
    caches = [cache_summary(p) for p in cache_files(settings)]
    if args.json:
        print_json({"central": central, "cache_folder": str(cache_folder(settings)),
                    "caches": caches})
        return 0
    print(f"localstate    {__version__}")
    print(f"central DB    {central['url']} (schema version {central['schema_version']})")
    print(f"state rows    {central['rows']} in {central['owners']} owners "
          f"({central['deleted']} deleted)")
    last = central["last_write_at"]
    print(f"last write    {human_time(last) + ' (' + _ago(last) + ')' if last else 'none'}")
    if central["writers"]:
        print()
        width = max(10, *(len(w["updated_by"]) for w in central["writers"]))
        print(f"{'WRITER':<{width}}  {'ROWS':>8}  LAST WRITE")
        for w in central["writers"]:
            at = w["last_write_at"]
            print(f"{w['updated_by']:<{width}}  {w['rows']:>8}  "
                  f"{human_time(at) if at else '-'} ({_ago(at)})")
    print()
    print(f"cache files in {cache_folder(settings)}")
    if not caches:
        print("  (none)")
        return 0
    width = max(10, *(len(Path(c["path"]).name) for c in caches))
    print(f"{'FILE':<{width}}  {'ROWS':>8}  {'UNFLUSHED':>9}  {'OLDEST UNFLUSHED':<18}  HELD BY")
    for c in caches:
        name = Path(c["path"]).name
        if "error" in c:
            print(f"{name:<{width}}  {c['error']}")
            continue
        held = c["held_by"] or "nobody"
        if c["held_by"] and c["running"] is False:
            held += " (not running: `localstate flush` flushes it)"
        elif c["running"]:
            held += " (running)"
        oldest = _ago(c["oldest_unflushed_at"]) if c["dirty"] else "-"
        print(f"{name:<{width}}  {c['rows']:>8}  {c['dirty']:>9}  {oldest:<18}  {held}")
    return 0
