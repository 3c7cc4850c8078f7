"""The DAG file of the exactly-once example: an Asset fed by `NewRowsEventsTrigger` (one event
per new row), and a DAG scheduled on it.

Settings come from the environment, as in ``new_rows_dag.py``: ``LOCALSTATE_EXAMPLE_DSN``
(``postgresql://...`` or ``sqlite:///path``), ``LOCALSTATE_EXAMPLE_TABLE`` (default
``orders``). The triggerer needs ``[localstate] sink = api`` (or ``sql`` on Airflow's DB).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from localstate.examples.new_rows_events_trigger import NewRowsEventsTrigger

TABLE = os.environ.get("LOCALSTATE_EXAMPLE_TABLE", "orders")

order_rows = Asset(
    name="order_rows",
    uri=f"localstate-example://{TABLE}/rows",
    watchers=[AssetWatcher(
        name="order_rows_watcher",
        trigger=NewRowsEventsTrigger(
            dsn=os.environ.get("LOCALSTATE_EXAMPLE_DSN", "sqlite:////tmp/localstate-example.db"),
            table=TABLE,
            batch_size=int(os.environ.get("LOCALSTATE_EXAMPLE_BATCH", "100")),
            poll_interval=float(os.environ.get("LOCALSTATE_EXAMPLE_POLL", "0.05")),
        ),
    )],
)

with DAG(dag_id="localstate_order_rows", schedule=[order_rows], catchup=False):

    @task
    def process_order_rows() -> None:
        """Runs for new rows; ``triggering_asset_events`` holds one event per row, each
        ``extra["payload"]`` naming its table and id."""

    process_order_rows()
