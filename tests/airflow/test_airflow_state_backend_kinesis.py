"""The Amazon provider's `KinesisTrigger`, unchanged, on `LocalStateBackend`.

moto's server serves Kinesis; one stream of two shards holds records. Real Airflow 3.3
processes on the suite's PostgreSQL, with ``[state_store] backend`` set (and
``flush_interval``): the dag processor and the scheduler activate an asset whose watcher is
Airflow's own ``KinesisTrigger`` (``TRIM_HORIZON``), then a triggerer runs it. The trigger
checkpoints each shard's sequence number through ``self.asset_state_store`` after it yields;
the test checks that those checkpoints land in localstate's table under the asset's owner
(claimed by the triggerer's backend) and in Airflow's ``asset_state_store`` (the mirror), and
that the records became asset events.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import asyncpg
import boto3
import pytest
from airflow_harness import Deployment, active_watchers, stop, wait_for, watcher_deployment, within
from backend_watchers import BACKEND_CFG

from localstate._testing.postgres_server import PostgresServer
from localstate._testing.queue_broker import moto_server

pytestmark = pytest.mark.postgres

REGION = "us-east-1"
STREAM = "orders"
RECORDS = 30
BOUND = 420.0

DAG = f'''
from airflow.providers.amazon.aws.triggers.kinesis import KinesisTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

stream = Asset("kinesis_orders", uri="kinesis://orders", watchers=[AssetWatcher(
    name="orders", trigger=KinesisTrigger(
        stream_name="{STREAM}", aws_conn_id="aws_default", region_name="{REGION}",
        shard_iterator_type="TRIM_HORIZON", waiter_delay=1))])

with DAG("kinesis_orders", schedule=[stream], catchup=False):
    @task
    def noop():
        pass

    noop()
'''


async def test_kinesis_trigger_checkpoints_on_localstate(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        (tmp_path / "moto").mkdir()
        moto = stack.enter_context(moto_server(tmp_path / "moto"))
        endpoint = f"http://{moto.address}"
        kinesis = boto3.client("kinesis", region_name=REGION, endpoint_url=endpoint,
                               aws_access_key_id="testing", aws_secret_access_key="testing")
        kinesis.create_stream(StreamName=STREAM, ShardCount=2)
        for i in range(RECORDS):
            kinesis.put_record(StreamName=STREAM, Data=json.dumps({"n": i}).encode(),
                               PartitionKey=f"k{i}")
        conn = {"conn_type": "aws", "login": "testing", "password": "testing",
                "extra": {"region_name": REGION, "endpoint_url": endpoint}}
        d = watcher_deployment(
            pg_server, tmp_path, triggers=("kinesis_nothing", ""),
            dag=("kinesis_dag", DAG), cfg=BACKEND_CFG,
            env={"AIRFLOW_CONN_AWS_DEFAULT": json.dumps(conn)})
        async with active_watchers(d, 1) as db:
            await within(BOUND, _scenario(d, db), d)


async def _scenario(d: Deployment, db: asyncpg.Connection) -> None:
    triggerer = d.start("triggerer", "triggerer")
    try:
        async def checkpointed() -> dict[str, str] | None:
            row = await db.fetchrow(
                "SELECT key, value::text AS value FROM localstate_state "
                "WHERE owner = 'asset_watcher:kinesis_orders' "
                "AND key LIKE 'kinesis_shard_sequence_numbers:%'")
            if row is None:
                return None
            value = json.loads(row["value"])
            return value if isinstance(value, dict) and len(value) == 2 else None

        checkpoint = await wait_for("both shards' checkpoints in localstate's table",
                                    checkpointed, d, 240)
        assert all(isinstance(seq, str) for seq in checkpoint.values())
        claim = await db.fetchrow(
            "SELECT epoch, claimant FROM localstate_owner_claim "
            "WHERE owner = 'asset_watcher:kinesis_orders'")
        assert claim is not None
        assert claim["claimant"].endswith("-state-backend")

        async def mirrored() -> bool:
            value = await db.fetchval(
                "SELECT s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
                "WHERE a.name = 'kinesis_orders' "
                "AND s.key LIKE 'kinesis_shard_sequence_numbers:%'")
            return value is not None and len(json.loads(value)) == 2

        await wait_for("the checkpoints in Airflow's asset_state_store", mirrored, d, 60)

        async def events() -> bool:
            return int(await db.fetchval(
                "SELECT count(*) FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                "WHERE a.name = 'kinesis_orders'")) >= 1

        await wait_for("the records' asset events", events, d, 60)
    finally:
        stop(triggerer)
