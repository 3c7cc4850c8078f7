"""status: where state goes (the central DB: rows, writers, last writes; or, under ``sink =
api``, the API server's own status) and the cache files on this host (rows not yet flushed,
the oldest unflushed write, who holds each); ``--fleet``: every triggerer's lag, backlog and
state, through the same backend."""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localstate._core.version import __version__
from localstate._sync.central.fleet import STALE_INTERVALS
from localstate._sync.central.schema import LATEST_VERSION
from localstate.cli._cache_files import cache_files, cache_folder, cache_summary
from localstate.cli._central import (
    central_url_for,
    open_central,
    schema_version,
    settings_for,
)
from localstate.cli._exit_codes import EXIT_ERROR
from localstate.cli._printing import human_time, print_json
from localstate.cli._state_backend import describe_backend, open_backend
from localstate.errors import CentralError, SchemaError

if TYPE_CHECKING:
    from localstate._sync.central.central_store import CentralStore

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

    from localstate._sync.central.engine import read_connection
    from localstate._sync.central.schema import current_version, event, state_variable

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
            e = event.c
            by_owner = [] if schema < 6 else (await conn.execute(
                select(e.owner, func.count(), func.sum(e.asset_events), func.max(e.committed_at))
                .group_by(e.owner).order_by(func.max(e.committed_at).desc()).limit(50))).all()
    except SQLAlchemyError as exc:
        raise CentralError(f"cannot read the central DB {central.url}: {exc}") from exc
    return {
        "url": central.url, "schema_version": schema, "rows": int(rows or 0),
        "owners": int(owners or 0), "deleted": int(deleted or 0),
        "last_write_at": _epoch(last),
        "writers": [{"updated_by": w, "rows": int(n), "last_write_at": _epoch(at)}
                    for w, n, at in by_writer],
        # events committed with watermarks (the de-duplication table; pruned by age)
        "events": [{"owner": o, "committed": int(n), "asset_events": int(a or 0),
                    "last_commit_at": _epoch(at)} for o, n, a, at in by_owner],
    }


def _print_fleet(fleet: dict[str, Any], where: str) -> None:
    members = fleet["triggerers"]
    print(f"fleet         {len(members)} triggerers ({where}), "
          f"{fleet['central_rows_per_s']:.1f} rows/s to the central DB, "
          f"{fleet['stale']} stalled, {fleet.get('idle', 0)} idle")
    if not members:
        return
    width = max(10, *(len(m["triggerer"]) for m in members))
    print(f"{'TRIGGERER':<{width}}  {'HOST:PID':<20}  {'STATE':<8}  {'LAST FLUSH':<14}  "
          f"{'BACKLOG':>7}  {'LAG':>8}  {'ROWS/S':>8}  {'INTERVAL':>8}")
    for m in members:
        flag = (f"  STALLED: keys waiting, no flush for over {STALE_INTERVALS:g} intervals"
                if m["stale"] else "")
        print(f"{m['triggerer']:<{width}}  {m['host'] + ':' + str(m['pid']):<20}  "
              f"{m.get('state', '-'):<8}  {_ago(m['last_flush_at']):<14}  "
              f"{m['dirty_keys']:>7}  {m['lag_s']:>7.2f}s  "
              f"{m['rows_per_s']:>8.1f}  {m['flush_interval']:>7.2f}s{flag}")


async def _api_status(settings: Any) -> dict[str, Any]:
    from localstate.client import AsyncStateClient

    async with AsyncStateClient(settings.api_url, token=settings.api_token,
                                timeout=settings.central_timeout) as client:
        return await client.status()


def _print_api(url: str, server: dict[str, Any]) -> None:
    print(f"API           {url} (sink = api: no database opened here)")
    print(f"its store     {server['triggerer_id']} on {server['central_url']}")
    last = _epoch(server.get("last_flush_at"))
    print(f"its flushes   {server['flushes']} (last {_ago(last)}), "
          f"{server['central_errors']} central errors, {server['conflicts']} conflicts")
    if server.get("last_error"):
        print(f"last error    {server['last_error']}")
    print("the fleet     `localstate status --fleet`")


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    kind, url = describe_backend(settings)
    if args.fleet:
        async def fleet() -> tuple[str, dict[str, Any]]:
            async with open_backend(settings, read_only=True) as backend:
                return backend.where, await backend.fleet()

        where, view = asyncio.run(fleet())
        if args.json:
            print_json({"fleet": view, "source": where})
        else:
            _print_fleet(view, where)
        return 0

    if kind == "api":
        server = asyncio.run(_api_status(settings))
        caches = [cache_summary(p) for p in cache_files(settings)]
        if args.json:
            print_json({"localstate": __version__, "api": {"url": url, "status": server},
                        "cache_folder": str(cache_folder(settings)), "caches": caches})
            return 0
        print(f"localstate    {__version__}")
        _print_api(url, server)
        _print_caches(settings, caches)
        return 0

    async def go() -> dict[str, Any]:
        async with open_central(settings, read_only=True) as central:
            return await _central_summary(central)

    try:
        central = asyncio.run(go())
    except SchemaError:
        behind = asyncio.run(schema_version(central_url_for(settings)))
        if behind >= LATEST_VERSION:
            raise
        print(f"localstate    {__version__}")
        print(f"central DB    schema {behind}, needs upgrade: run `localstate db upgrade` "
              f"(this release uses schema {LATEST_VERSION})")
        return EXIT_ERROR
    caches = [cache_summary(p) for p in cache_files(settings)]
    if args.json:
        print_json({"localstate": __version__, "central": central,
                    "cache_folder": str(cache_folder(settings)), "caches": caches})
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
    if central["events"]:
        print()
        width = max(10, *(len(e["owner"]) for e in central["events"]))
        print(f"{'EVENTS OF':<{width}}  {'COMMITTED':>9}  {'ASSET EVENTS':>12}  LAST COMMIT")
        for e in central["events"]:
            print(f"{e['owner']:<{width}}  {e['committed']:>9}  {e['asset_events']:>12}  "
                  f"{_ago(e['last_commit_at'])}")
    _print_caches(settings, caches)
    return 0


def _print_caches(settings: Any, caches: list[dict[str, Any]]) -> None:
    print()
    print(f"cache files in {cache_folder(settings)}")
    if not caches:
        print("  (none)")
        return
    width = max(10, *(len(Path(c["path"]).name) for c in caches))
    print(f"{'FILE':<{width}}  {'ROWS':>8}  {'UNFLUSHED':>9}  {'OLDEST UNFLUSHED':<18}  "
          f"{'EVENTS PENDING':>14}  {'OLDEST EVENT':<14}  HELD BY")
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
        event_at = _ago(c["oldest_pending_event_at"]) if c["pending_events"] else "-"
        print(f"{name:<{width}}  {c['rows']:>8}  {c['dirty']:>9}  {oldest:<18}  "
              f"{c['pending_events']:>14}  {event_at:<14}  {held}")
