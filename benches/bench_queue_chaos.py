"""The long variant of tests/airflow/test_airflow_queue_chaos.py: every message one asset event
from localstate's queue watchers (Kafka fanned out to two assets, Redis Streams, SQS) under
many faults, beside Airflow's own ``MessageQueueTrigger`` on the same brokers.

    python benches/bench_queue_chaos.py [--kills 100] [--zombies 10] [--api-restarts 5]
        [--rate 4] [--health-threshold 10] [--json docs/bench-queue-chaos.json]

Starts a throwaway PostgreSQL server and the brokers (tests/support/queue_chaos.py), runs
`events_chaos.run` with them, then prints the table: per kind of watcher and per asset, the
messages produced, the ``asset_event`` rows, duplicates, missing messages and events out of
order (within a Kafka partition or the Redis stream). The command line is
tests/support/chaos_bench.py's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests" / "support")]

from chaos_bench import bench_main  # noqa: E402
from events_chaos import Scenario, Schedule  # noqa: E402
from queue_chaos import queue_scenario  # noqa: E402


@contextmanager
def _queues(tmp: Path, schedule: Schedule) -> Iterator[Scenario | None]:
    with queue_scenario(tmp) as q:
        yield q.scenario


if __name__ == "__main__":
    bench_main(__doc__, rate=4.0, scenarios=_queues)
