"""db prune: delete central rows not updated for a while, and old tombstones (retention)."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import asdict

from localstate._core.retention_rules import parse_age
from localstate.cli._central import open_central, settings_for
from localstate.cli._printing import print_json

__all__ = ["cmd_db_prune"]


def cmd_db_prune(args: argparse.Namespace) -> int:
    from localstate._metrics import report_prune
    from localstate._sync.central.retention import prune

    settings = settings_for(args)
    older_than = None if args.older_than is None else parse_age(args.older_than,
                                                                what="--older-than")
    horizon = parse_age(args.tombstone_horizon, what="--tombstone-horizon")
    if horizon is None:
        from localstate.errors import InvalidInput

        raise InvalidInput("--tombstone-horizon cannot be never: give an age such as 30d")

    event_horizon = parse_age(args.event_horizon, what="--event-horizon")
    if event_horizon is None:
        from localstate.errors import InvalidInput

        raise InvalidInput("--event-horizon cannot be never: give an age such as 7d")

    async def go() -> dict[str, object]:
        async with open_central(settings) as central:
            report = await prune(
                central, older_than=older_than, owner_prefix=args.owner_prefix or "",
                retention=settings.retention, tombstone_horizon=horizon,
                dry_run=args.dry_run, batch_size=args.batch_size,
                event_horizon=event_horizon)
        if not report.dry_run:
            await report_prune(settings, report.rows, report.tombstones)
        return {**asdict(report), "deleted": report.deleted}

    result = asyncio.run(go())
    if args.json:
        print_json(result)
        return 0
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {result['rows']} rows, {result['tombstones']} tombstones, "
          f"{result['event_keys']} event keys and {result['history_rows']} history rows "
          f"({result['scanned']} old rows looked at, {result['batches']} delete transactions)")
    return 0
