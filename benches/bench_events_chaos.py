"""The long variant of tests/airflow/test_airflow_events_chaos.py: exactly-once watcher events
under many faults, localstate's emit beside a plain Airflow watcher.

    python benches/bench_events_chaos.py [--kills 100] [--zombies 10] [--api-restarts 5]
        [--watchers 2] [--rate 5] [--health-threshold 10] [--json out.json]

Starts a throwaway PostgreSQL server and runs `events_chaos.run` (real ``airflow api-server``
with localstate's plugin, two ``airflow triggerer`` processes with ``sink = api``, the dag
processor and scheduler to register the watchers), then prints the table: per kind of watcher,
the items fed, the ``asset_event`` rows, duplicates, missing items and events out of order.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "support")]

from events_chaos import Schedule, run  # noqa: E402

from localstate._testing.postgres_server import PostgresServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--zombies", type=int, default=10)
    parser.add_argument("--api-restarts", type=int, default=5)
    parser.add_argument("--watchers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--health-threshold", type=float, default=10.0)
    parser.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0))
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    schedule = Schedule(kills=args.kills, zombies=args.zombies, api_restarts=args.api_restarts,
                        gap=tuple(args.gap), health_threshold=args.health_threshold,
                        watchers=args.watchers, rate=args.rate, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-events-chaos-") as tmp:
        server = PostgresServer(Path(tmp) / "pg")
        server.start()
        try:
            outcome = asyncio.run(run(server, Path(tmp), schedule, progress=True))
        finally:
            server.close()
    print("\n".join(outcome.log))
    print(outcome.table())
    if args.json:
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"),
            "hardware": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}",
            "schedule": dataclasses.asdict(schedule), "emit": dataclasses.asdict(outcome.emit),
            "plain": dataclasses.asdict(outcome.plain), "kills": outcome.kills,
            "zombies": outcome.zombies, "takeovers": outcome.takeovers,
            "api_restarts": outcome.api_restarts, "consumer_runs": outcome.consumer_runs,
            "seconds": round(outcome.seconds),
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
