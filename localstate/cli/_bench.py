"""bench: the write-throughput benchmark (local-first against direct writes and peers)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

__all__ = ["churn_summary", "cmd_bench"]

_MIB = 1024 * 1024


def _churn(url: str, folder: Path, owners: int) -> dict[str, Any]:
    """RSS and cache file under churn: 1,000 live triggers, `owners` passing through."""
    from localstate._bench.churn import run_churn

    result = asyncio.run(run_churn(central_url=url, cache_path=folder / "churn.db",
                                   owners=owners, every=max(100, owners // 20)))
    return result.as_dict()


def churn_summary(churn: dict[str, Any]) -> str:
    """One sentence: RSS and the cache file as owners came and went."""
    samples = churn["samples"]
    if not samples:
        return "churn: no sample"
    first, last = samples[0], samples[-1]
    rss_max = max(s["rss"] for s in samples)
    file_max = max(s["cache_bytes"] for s in samples)
    return (f"churn: {churn['owners']:,} owners through {churn['live']:,} live triggers "
            f"(max_keys_in_memory {churn['max_keys']:,}) in {churn['seconds']:.0f} s: RSS "
            f"{first['rss'] / _MIB:.1f} MiB after {first['owners']:,} owners, "
            f"{last['rss'] / _MIB:.1f} MiB at the end (max {rss_max / _MIB:.1f}); cache file "
            f"{first['cache_bytes'] / _MIB:.2f} MiB, then {last['cache_bytes'] / _MIB:.2f} MiB "
            f"(max {file_max / _MIB:.2f}); keys in memory at the end "
            f"{last['keys_in_memory']:,}")


def _fleet(args: argparse.Namespace) -> int:
    from localstate._bench.fleet import FleetConfig, run_fleet
    from localstate._bench.report import write_json

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
    from localstate._bench import BenchConfig, print_table, run_bench, summary
    from localstate._bench.report import write_json, write_plot

    if args.fleet is not None:
        return _fleet(args)

    cfg = BenchConfig(central_url=args.central_url, progress=not args.no_progress,
                      poll_delay=args.poll_delay, shared_keys=args.shared_keys,
                      flush_interval=args.flush_interval, airflow_sink=args.airflow_sink,
                      airflow_keys=args.airflow_keys)
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
    churn_owners = args.churn_owners
    if churn_owners is None:
        churn_owners = 5000 if args.quick else 20_000
    if churn_owners:
        result["churn"] = _churn(cfg.url, cfg.folder, churn_owners)
    print_table(result)
    print()
    print(summary(result))
    if "churn" in result:
        print(churn_summary(result["churn"]))
    if args.json:
        write_json(result, args.json)
        print(f"\nwrote {args.json}")
    if args.plot:
        write_plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
