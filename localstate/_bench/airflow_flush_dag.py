"""The DAG file of the benchmark's ``sink = airflow`` row: one asset watched by
`FlushBenchTrigger` (`localstate._bench.airflow_flush`, which copies this file into the
deployment's DAG folder, sets ``LOCALSTATE_BENCH_FOLDER`` and ``LOCALSTATE_BENCH_KEYS``)."""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from localstate._bench.airflow_flush_trigger import FlushBenchTrigger

ASSET = "localstate_bench_flush"

bench_asset = Asset(
    name=ASSET,
    uri="localstate-bench://flush",
    watchers=[AssetWatcher(name="flush_bench", trigger=FlushBenchTrigger(
        folder=os.environ.get("LOCALSTATE_BENCH_FOLDER", "/tmp/localstate-bench-flush"),
        keys=int(os.environ.get("LOCALSTATE_BENCH_KEYS", "1000")),
    ))],
)

with DAG(dag_id="localstate_bench_flush", schedule=[bench_asset], catchup=False):

    @task
    def nothing() -> None:
        """The watcher is what the benchmark runs; the DAG is never triggered by it."""

    nothing()
