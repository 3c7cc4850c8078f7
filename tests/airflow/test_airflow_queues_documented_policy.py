"""Every shipped queue watcher under exactly the conflict policy the documentation gives (the
README's and the deployment guide's ``airflow.cfg``, the Helm values' triggerer environment),
against real brokers (Tansu, ``redis-server``, moto's SQS) and, as the central DB, a migrated
Airflow 3.3 metadata DB (PostgreSQL, ``sink = sql``: where asset watchers' events may go).

The watchers' watermarks are objects (Kafka's next offset per partition, a Redis stream's id
and count, SQS's count), so a policy whose declared order refuses objects (``max:int``) failed
every emit of an ``asset_watcher:`` owner and the watcher restarted for good. Each trigger
runs as the triggerer runs it, with Airflow's accessors of its watched assets (the owner is the
asset's, ``asset_watcher:<name>``), and must deliver every message once.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis
import yaml
from aiobotocore.session import get_session
from airflow.sdk import Asset
from airflow.sdk.execution_time.context import AssetStateStoreAccessors
from airflow_api_server import migrate, new_airflow
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from queue_watchers import running, wait_for_keys

from localstate import StateStore
from localstate._core.config import Settings
from localstate._testing.postgres_server import PostgresServer
from localstate._testing.queue_broker import QueueBroker, moto_server, redis_server, tansu
from localstate.airflow._serving import central_url_of
from localstate.airflow.queues import KafkaTopicTrigger, RedisStreamTrigger, SqsQueueTrigger

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
AWS = {"region_name": "us-east-1", "aws_access_key_id": "testing",
       "aws_secret_access_key": "testing"}
MESSAGES = 60


def _ini_policies(path: Path, tmp_path: Path) -> list[str | dict[str, str]]:
    """The conflict policy of each ``airflow.cfg`` block of `path` that sets one, as the
    settings read it."""
    found = []
    blocks = re.findall(r"^```ini\n(.*?)^```$", path.read_text(), re.S | re.M)
    for n, block in enumerate(b for b in blocks if "\nconflict_policy = " in b):
        cfg = tmp_path / f"{path.stem}-{n}.cfg"
        cfg.write_text(block)
        found.append(Settings.resolve(environ={}, config_file=cfg).conflict_policy)
    return found


def documented_policy(tmp_path: Path) -> str | dict[str, str]:
    """The triggerers' policy the README, docs/deploy.md and the Helm values give: one."""
    policies = [*_ini_policies(ROOT / "README.md", tmp_path),
                *_ini_policies(ROOT / "docs" / "deploy.md", tmp_path)]
    values = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "values.yaml").read_text())
    env = {e["name"]: e["value"] for e in values["triggerer"]["env"] if "value" in e}
    (tmp_path / "empty.cfg").write_text("")
    policies.append(Settings.resolve(environ=env,
                                     config_file=tmp_path / "empty.cfg").conflict_policy)
    assert len(policies) == 3, policies
    assert all(p == policies[0] for p in policies), policies
    assert isinstance(policies[0], dict), policies[0]
    assert "asset_watcher:*" in policies[0], policies[0]
    return policies[0]


@pytest_asyncio.fixture
async def store(airflow_db: str, tmp_path: Path) -> AsyncIterator[StateStore]:
    """A triggerer's store (``sink = sql`` on Airflow's DB) under the documented policy."""
    opened = await StateStore.open(
        central_url=airflow_db, cache_path=tmp_path / "triggerer.db",
        triggerer_id=f"documented-{uuid.uuid4().hex[:6]}", flush_interval=0.2,
        conflict_policy=documented_policy(tmp_path))
    yield opened
    await opened.close()


def watching(trigger: Any, *assets: str) -> Any:
    """`trigger` as the triggerer hands it over: with the accessors of its watched assets."""
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name=a) for a in assets])
    return trigger


@pytest.fixture(scope="module")
def airflow_db(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A migrated Airflow metadata DB's URL, as the central DB."""
    d = new_airflow(pg_server, tmp_path_factory.mktemp("airflow-documented"))
    migrate(d)
    return central_url_of(d.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueBroker]:
    with tansu(tmp_path_factory.mktemp("tansu")) as b:
        yield b


@pytest.fixture(scope="module")
def redis_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueBroker]:
    with redis_server(tmp_path_factory.mktemp("redis")) as b:
        yield b


@pytest.fixture(scope="module")
def sqs_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueBroker]:
    with moto_server(tmp_path_factory.mktemp("moto")) as b:
        yield b


def new_topic(broker: QueueBroker, partitions: int = 3) -> str:
    name = f"documented-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.address})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": broker.address, "enable.idempotence": True})
    for n in range(1, MESSAGES + 1):
        producer.produce(name, value=str(n).encode(), partition=n % partitions)
    assert producer.flush(30) == 0
    return name


@pytest.mark.parametrize("fan_out", [False, True], ids=["one-asset", "fan-out"])
async def test_the_kafka_watcher_runs_under_the_documented_policy(
        kafka: QueueBroker, airflow_db: str, store: StateStore,
        fan_out: bool) -> None:
    topic = new_topic(kafka)
    if fan_out:  # by parity: half the messages to each asset
        trigger = watching(KafkaTopicTrigger(
            topic=topic, bootstrap_servers=kafka.address, poll_timeout=0.2,
            route="e2e_queue_functions.by_parity"), "emit_kafka_even", "emit_kafka_odd")
        expected = {"asset_watcher:emit_kafka_even": MESSAGES // 2,
                    "asset_watcher:emit_kafka_odd": MESSAGES // 2}
    else:
        trigger = watching(KafkaTopicTrigger(topic=topic, bootstrap_servers=kafka.address,
                                             poll_timeout=0.2), topic)
        expected = {f"asset_watcher:{topic}": MESSAGES}
    async with running(trigger, store) as task:
        for owner, count in expected.items():
            keys = await wait_for_keys(airflow_db, owner, count, store, task)
            assert len(keys) == len(set(keys)) == count, (owner, len(keys))
    for owner in expected:
        assert await store.get(owner, "watermark") == {"0": 20, "1": 20, "2": 20}


async def test_the_redis_watcher_runs_under_the_documented_policy(
        redis_broker: QueueBroker, airflow_db: str,
        store: StateStore) -> None:
    stream = f"documented-{uuid.uuid4().hex[:8]}"
    client = redis.Redis(host="127.0.0.1", port=redis_broker.port)
    added = [client.xadd(stream, {"n": str(n)}) for n in range(1, MESSAGES + 1)]
    ids = [i.decode() if isinstance(i, bytes) else i for i in added]
    client.close()
    trigger = watching(RedisStreamTrigger(stream=stream, url=f"redis://{redis_broker.address}/0",
                                          block_ms=100, max_messages=25), stream)
    owner = f"asset_watcher:{stream}"
    async with running(trigger, store) as task:
        keys = await wait_for_keys(airflow_db, owner, MESSAGES, store, task)
    assert keys == [f"{stream}/{i}" for i in ids]
    assert await store.get(owner, "watermark") == {"id": ids[-1], "read": MESSAGES}


async def test_the_sqs_watcher_runs_under_the_documented_policy(
        sqs_broker: QueueBroker, airflow_db: str, store: StateStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    endpoint = f"http://{sqs_broker.address}"
    async with get_session().create_client("sqs", endpoint_url=endpoint, **AWS) as sqs:
        url = (await sqs.create_queue(QueueName=f"documented-{uuid.uuid4().hex[:8]}"))[
            "QueueUrl"]
        for start in range(1, MESSAGES + 1, 10):
            await sqs.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(n), "MessageBody": str(n)} for n in range(start, start + 10)])
    trigger = watching(SqsQueueTrigger(queue_url=url, aws_conn_id=None, endpoint_url=endpoint,
                                       region_name="us-east-1", wait_seconds=0), "sqs-orders")
    owner = "asset_watcher:sqs-orders"
    async with running(trigger, store) as task:
        keys = await wait_for_keys(airflow_db, owner, MESSAGES, store, task)
    assert len(keys) == len(set(keys)) == MESSAGES
