"""The long variant of tests/airflow/test_airflow_events_chaos.py: exactly-once watcher events
under many faults, localstate's emit beside a plain Airflow watcher.

    python benches/bench_events_chaos.py [--kills 100] [--zombies 10] [--api-restarts 5]
        [--watchers 2] [--rate 5] [--health-threshold 10] [--json out.json]

Starts a throwaway PostgreSQL server and runs `events_chaos.run` (real ``airflow api-server``
with localstate's plugin, two ``airflow triggerer`` processes with ``sink = api``, the dag
processor and scheduler to register the watchers), then prints the table: per kind of watcher,
the items fed, the ``asset_event`` rows, duplicates, missing items and events out of order.
The command line is tests/support/chaos_bench.py's.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "tests" / "support")]

from chaos_bench import bench_main  # noqa: E402

if __name__ == "__main__":
    bench_main(__doc__, rate=5.0, watchers=True)
