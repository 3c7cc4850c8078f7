"""The command line the chaos benchmarks share (benches/bench_events_chaos.py,
benches/bench_queue_chaos.py): the schedule's options, a throwaway PostgreSQL server,
`events_chaos.run` with the bench's scenario, the table, and the figures as JSON."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from events_chaos import Outcome, Scenario, Schedule, run

from localstate._testing.postgres_server import PostgresServer

#: a bench's scenario: given the run's folder and schedule, a context that yields the
#: scenario (None: the numbered files of `events_chaos.file_scenario`) and tears it down after
Scenarios = Callable[[Path, Schedule], AbstractContextManager[Scenario | None]]


@contextmanager
def _files(tmp: Path, schedule: Schedule) -> Iterator[Scenario | None]:
    yield None


def bench_main(doc: str, *, rate: float, watchers: bool = False,
               scenarios: Scenarios = _files) -> None:
    """Parse the command line (`doc`: the bench's docstring; `rate`: the default items per
    second; `watchers`: offer ``--watchers``), run the scenario, print the log and the table,
    and write ``--json``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--zombies", type=int, default=10)
    parser.add_argument("--api-restarts", type=int, default=5)
    if watchers:
        parser.add_argument("--watchers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=rate)
    parser.add_argument("--health-threshold", type=float, default=10.0)
    parser.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0))
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    schedule = Schedule(kills=args.kills, zombies=args.zombies, api_restarts=args.api_restarts,
                        gap=tuple(args.gap), health_threshold=args.health_threshold,
                        watchers=getattr(args, "watchers", 2), rate=args.rate, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as tmp:
        server = PostgresServer(Path(tmp) / "pg")
        server.start()
        try:
            with scenarios(Path(tmp), schedule) as scenario:
                outcome = asyncio.run(run(server, Path(tmp), schedule, progress=True,
                                          scenario=scenario))
        finally:
            server.close()
    print("\n".join(outcome.log))
    print(outcome.table())
    if args.json:
        args.json.write_text(json.dumps(figures(schedule, outcome), indent=2) + "\n")


def figures(schedule: Schedule, outcome: Outcome) -> dict[str, object]:
    """What a bench run measured, with its date and hardware, for the docs."""
    return {
        "date": time.strftime("%Y-%m-%d"),
        "hardware": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}",
        "schedule": dataclasses.asdict(schedule), "emit": dataclasses.asdict(outcome.emit),
        "plain": dataclasses.asdict(outcome.plain),
        "by_asset": {k: dataclasses.asdict(v) for k, v in outcome.by_asset.items()},
        "kills": outcome.kills, "zombies": outcome.zombies, "takeovers": outcome.takeovers,
        "api_restarts": outcome.api_restarts, "source_faults": outcome.source_faults,
        "consumer_runs": outcome.consumer_runs, "seconds": round(outcome.seconds),
    }
