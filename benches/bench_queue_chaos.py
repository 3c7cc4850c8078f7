"""The message-queue scenario of tests/support/queue_chaos.py at length: every message one
asset event from localstate's queue watchers (Kafka fanned out to two assets, Redis Streams,
SQS) under many faults, beside Airflow's own ``MessageQueueTrigger`` on the same brokers.

    python benches/bench_queue_chaos.py [--kills 100] [--zombies 10] [--api-restarts 5]
        [--rate 4] [--health-threshold 10] [--json docs/bench-queue-chaos.json]

Starts a throwaway PostgreSQL server and the brokers (tests/support/queue_chaos.py), runs
`events_chaos.run` with them, then prints the table: per kind of watcher and per asset, the
messages produced, the ``asset_event`` rows, duplicates, missing messages and events out of
order (within a Kafka partition or the Redis stream).
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
from queue_chaos import queue_scenario  # noqa: E402

from localstate._testing.postgres_server import PostgresServer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--zombies", type=int, default=10)
    parser.add_argument("--api-restarts", type=int, default=5)
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--health-threshold", type=float, default=10.0)
    parser.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0))
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    schedule = Schedule(kills=args.kills, zombies=args.zombies, api_restarts=args.api_restarts,
                        gap=tuple(args.gap), health_threshold=args.health_threshold,
                        rate=args.rate, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-queue-chaos-") as tmp:
        server = PostgresServer(Path(tmp) / "pg")
        server.start()
        try:
            with queue_scenario(Path(tmp)) as (scenario, _brokers):
                outcome = asyncio.run(run(server, Path(tmp), schedule, progress=True,
                                          scenario=scenario))
        finally:
            server.close()
    print("\n".join(outcome.log))
    print(outcome.table())
    if args.json:
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d"),
            "hardware": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}",
            "schedule": dataclasses.asdict(schedule), "emit": dataclasses.asdict(outcome.emit),
            "plain": dataclasses.asdict(outcome.plain),
            "by_asset": {k: dataclasses.asdict(v) for k, v in outcome.by_asset.items()},
            "kills": outcome.kills, "zombies": outcome.zombies,
            "takeovers": outcome.takeovers, "api_restarts": outcome.api_restarts,
            "source_faults": outcome.source_faults, "consumer_runs": outcome.consumer_runs,
            "seconds": round(outcome.seconds),
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
