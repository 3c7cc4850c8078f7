"""The DAG file of the example: an Asset fed by `NewRowsTrigger`, and a DAG scheduled on it.

Settings come from the environment so one file serves any deployment (and the end-to-end
test): ``LOCALSTATE_EXAMPLE_DSN`` (``postgresql://...`` or ``sqlite:///path``),
``LOCALSTATE_EXAMPLE_TABLE`` (default ``orders``). Put ``[localstate] sink = airflow`` in
airflow.cfg to keep the watermark in Airflow's asset state store.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Asset, AssetWatcher, task

from localstate.examples.new_rows_trigger import NewRowsTrigger

TABLE = os.environ.get("LOCALSTATE_EXAMPLE_TABLE", "orders")

new_orders = Asset(
    name="new_orders",
    uri=f"localstate-example://{TABLE}",
    watchers=[AssetWatcher(
        name="new_orders_watcher",
        trigger=NewRowsTrigger(
            dsn=os.environ.get("LOCALSTATE_EXAMPLE_DSN", "sqlite:////tmp/localstate-example.db"),
            table=TABLE,
            batch_size=int(os.environ.get("LOCALSTATE_EXAMPLE_BATCH", "100")),
            poll_interval=float(os.environ.get("LOCALSTATE_EXAMPLE_POLL", "0.05")),
            ack_delay=float(os.environ.get("LOCALSTATE_EXAMPLE_ACK_DELAY", "5")),
        ),
    )],
)

with DAG(dag_id="localstate_new_orders", schedule=[new_orders], catchup=False):

    @task
    def process_new_orders() -> None:
        """Runs per batch of new rows (the event's payload names them)."""

    process_new_orders()
