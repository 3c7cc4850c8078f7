"""bench: the write-throughput benchmark (local-first against direct writes and peers)."""

from __future__ import annotations

import argparse
import asyncio

__all__ = ["cmd_bench"]


def _fleet(args: argparse.Namespace) -> int:
    from localstate.bench.fleet import FleetConfig, run_fleet
    from localstate.bench.report import write_json

    cfg = FleetConfig(central_url=args.central_url or "", triggerers=args.fleet,
                      budget=args.budget, flush_interval=args.flush_interval or 1.0)
    if args.triggers is not None:
        cfg.triggers = args.triggers[0]
    if args.duration is not None:
        cfg.window = args.duration
    if args.folder is not None:
        cfg.folder = args.folder
    row = asyncio.run(run_fleet(cfg))
    width = max(len(k) for k in row)
    for k, v in row.items():
        print(f"{k:<{width}}  {round(v, 2) if isinstance(v, float) else v}")
    if args.json:
        write_json({"rows": [row]}, args.json)
        print(f"\nwrote {args.json}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from localstate.bench import BenchConfig, print_table, run_bench, summary
    from localstate.bench.report import write_json, write_plot

    if args.fleet is not None:
        return _fleet(args)

    cfg = BenchConfig(central_url=args.central_url, progress=not args.no_progress,
                      poll_delay=args.poll_delay, shared_keys=args.shared_keys,
                      flush_interval=args.flush_interval)
    if args.quick:
        cfg.duration = 1.0
        cfg.triggers = [1, 100, 1000]
    if args.duration is not None:
        cfg.duration = args.duration
    if args.triggers is not None:
        cfg.triggers = args.triggers
    if args.modes is not None:
        cfg.modes = args.modes
    if args.folder is not None:
        cfg.folder = args.folder
    result = asyncio.run(run_bench(cfg))
    print_table(result)
    print()
    print(summary(result))
    if args.json:
        write_json(result, args.json)
        print(f"\nwrote {args.json}")
    if args.plot:
        write_plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
