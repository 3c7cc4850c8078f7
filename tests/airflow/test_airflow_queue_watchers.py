"""The queue watchers as the triggerer runs them, with Airflow's accessors of their watched
assets (the owner is the asset's, ``asset_watcher:<name>``), against real brokers (Tansu,
``redis-server``, moto's SQS) and, as the central DB, a migrated Airflow 3.3 metadata DB
(PostgreSQL, ``sink = sql``: where asset watchers' events become asset events).

* Under exactly the conflict policy the documentation gives (the README's and the deployment
  guide's ``airflow.cfg``, the Helm values' triggerer environment). The watchers' watermarks
  are objects (Kafka's next offset per partition, a Redis stream's id and count, SQS's count),
  so a policy whose declared order refuses objects (``max:int``) failed every emit and the
  watcher restarted for good.
* No message stops a watcher: one larger than ``max_value_bytes`` and one whose route raises,
  in the middle of a stream, each get a flagged event, and every later message its own.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
import redis
import yaml
from aiobotocore.session import get_session
from airflow.sdk import Asset
from airflow.sdk.execution_time.context import AssetStateStoreAccessors
from airflow_api_server import migrate, new_airflow
from airflow_harness import Deployment
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from queue_watchers import running, wait_for_keys

from localstate import StateStore
from localstate._core.config import Settings
from localstate._testing.postgres_server import PostgresServer
from localstate._testing.queue_broker import QueueBroker, moto_server, redis_server, tansu
from localstate.airflow._serving import central_url_of
from localstate.airflow.queues import KafkaTopicTrigger, RedisStreamTrigger, SqsQueueTrigger
from localstate.errors import ValueTooLarge

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
    # the policy's own entry: the others (a token read from the pod's file by _CMD) need a pod
    env = {e["name"]: e["value"] for e in values["triggerer"]["env"]
           if e["name"] == "AIRFLOW__LOCALSTATE__CONFLICT_POLICY"}
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


async def active_assets(dsn: str, *names: str) -> None:
    """Active assets named `names` in Airflow's DB, as the dag processor makes them."""
    db = await asyncpg.connect(dsn)
    try:
        for name in names:
            await db.execute(
                "INSERT INTO asset (name, uri, \"group\", extra, created_at, updated_at) "
                "VALUES ($1, $2, 'asset', '{}', now(), now())", name, f"test://{name}")
            await db.execute("INSERT INTO asset_active (name, uri) VALUES ($1, $2)", name,
                             f"test://{name}")
    finally:
        await db.close()


async def payloads(dsn: str, name: str) -> list[dict[str, Any]]:
    """The payloads of asset `name`'s events in Airflow's ``asset_event``, in order."""
    db = await asyncpg.connect(dsn)
    try:
        rows = await db.fetch(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.name = $1 ORDER BY e.id", name)
    finally:
        await db.close()
    extras = [json.loads(r["extra"]) if isinstance(r["extra"], str) else r["extra"]
              for r in rows]
    return [dict(e["payload"]) for e in extras]


def watching(trigger: Any, *assets: str) -> Any:
    """`trigger` as the triggerer hands it over: with the accessors of its watched assets."""
    trigger.asset_state_store = AssetStateStoreAccessors(inlets=[Asset(name=a) for a in assets])
    return trigger


@pytest.fixture(scope="module")
def airflow(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    """A migrated Airflow metadata DB."""
    d = new_airflow(pg_server, tmp_path_factory.mktemp("airflow-queues"))
    migrate(d)
    return d


@pytest.fixture(scope="module")
def airflow_db(airflow: Deployment) -> str:
    """Its URL, as the central DB."""
    return central_url_of(airflow.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])


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


# -- no message stops a watcher ------------------------------------------------------------

BIG = 100_000  # bytes: over max_value_bytes (64 KiB by default)


async def test_a_kafka_message_too_large_and_one_whose_route_raises_do_not_stop_the_watcher(
        kafka: QueueBroker, airflow: Deployment, airflow_db: str, store: StateStore) -> None:
    """Messages 1-30 of one partition, routed by their number's parity: message 10 is 100 KB
    (its event goes to ``even`` without its value, flagged), message 20 is not a number (the
    route raises: its event, whole, goes to the dead-letter asset); every other message's
    event goes where its route says, each once, in order."""
    even, odd, dead = "even", "odd", "dead-letter"  # the route's names: once per module
    await active_assets(airflow.airflow_dsn, even, odd, dead)
    topic = f"bad-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": kafka.address})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": True,
                         "message.max.bytes": 2 * BIG})
    values = {n: str(n).encode() for n in range(1, 31)}
    values[10] = b"10:" + b"x" * BIG
    values[20] = b"not a number"
    for n in range(1, 31):
        producer.produce(topic, value=values[n], partition=0)
    assert producer.flush(30) == 0
    trigger = watching(KafkaTopicTrigger(
        topic=topic, bootstrap_servers=kafka.address, poll_timeout=0.2, max_messages=7,
        route="e2e_queue_functions.by_leading_number", dead_letter=dead),
        even, odd, dead)
    async with running(trigger, store) as task:
        await wait_for_keys(airflow_db, f"asset_watcher:{odd}", 15, store, task)
        await wait_for_keys(airflow_db, f"asset_watcher:{even}", 14, store, task)
        await wait_for_keys(airflow_db, f"asset_watcher:{dead}", 1, store, task)
    evens = await payloads(airflow.airflow_dsn, even)
    assert [p["offset"] + 1 for p in evens] == [n for n in range(2, 31, 2) if n != 20]
    big = evens[4]
    assert big["omitted"] == "too_large"
    assert big["size"] > BIG
    assert "value" not in big
    assert "key" not in big
    assert (big["topic"], big["partition"], big["offset"]) == (topic, 0, 9)
    assert all("omitted" not in p for p in evens if p is not big)
    odds = await payloads(airflow.airflow_dsn, odd)
    assert [int(p["value"]) for p in odds] == list(range(1, 31, 2))
    [dead_letter] = await payloads(airflow.airflow_dsn, dead)
    assert dead_letter["value"] == "not a number"
    assert dead_letter["offset"] == 19
    assert dead_letter["route_error"].startswith("ValueError: ")
    assert store.stats().queue_bad_messages == 2
    assert store.stats().sources_by_owner[trigger.state_owner]["bad_messages"] == 2


async def test_a_redis_entry_too_large_gets_a_flagged_event_and_the_stream_moves_on(
        redis_broker: QueueBroker, airflow: Deployment, airflow_db: str,
        store: StateStore) -> None:
    stream = f"bad-{uuid.uuid4().hex[:8]}"
    await active_assets(airflow.airflow_dsn, stream)
    client = redis.Redis(host="127.0.0.1", port=redis_broker.port)
    for n in range(1, 21):
        client.xadd(stream, {"n": str(n), "blob": "x" * (BIG if n == 5 else 1)})
    client.close()
    trigger = watching(RedisStreamTrigger(stream=stream, url=f"redis://{redis_broker.address}/0",
                                          block_ms=100, max_messages=6), stream)
    async with running(trigger, store) as task:
        await wait_for_keys(airflow_db, f"asset_watcher:{stream}", 20, store, task)
    events = await payloads(airflow.airflow_dsn, stream)
    assert len(events) == 20
    assert events[4]["omitted"] == "too_large"
    assert "fields" not in events[4]
    assert events[4]["size"] > BIG
    assert [int(e["fields"]["n"]) for i, e in enumerate(events) if i != 4] == [
        n for n in range(1, 21) if n != 5]
    assert store.stats().queue_bad_messages == 1


@pytest.mark.parametrize("on_bad_message", ["fail"])
async def test_fail_is_an_explicit_choice(
        redis_broker: QueueBroker, airflow: Deployment, store: StateStore,
        on_bad_message: str) -> None:
    stream = f"fail-{uuid.uuid4().hex[:8]}"
    await active_assets(airflow.airflow_dsn, stream)
    client = redis.Redis(host="127.0.0.1", port=redis_broker.port)
    client.xadd(stream, {"blob": "x" * BIG})
    client.close()
    trigger = watching(RedisStreamTrigger(stream=stream, url=f"redis://{redis_broker.address}/0",
                                          block_ms=100, on_bad_message=on_bad_message), stream)
    with pytest.raises(ValueTooLarge, match="on_bad_message='fail'"):  # the trigger's end
        async with running(trigger, store) as task:
            await asyncio.wait({task}, timeout=60)
    assert store.stats().events_emitted == 0


# -- each field says its own encoding ------------------------------------------------------


def decoded(field: Any) -> bytes | None:
    """The documented rule: text is its UTF-8 bytes, ``{"base64": ...}`` its base64's."""
    if field is None:
        return None
    if isinstance(field, str):
        return field.encode()
    return base64.b64decode(field["base64"])


async def test_kafka_keys_and_values_each_say_their_encoding(
        kafka: QueueBroker, airflow: Deployment, airflow_db: str, store: StateStore) -> None:
    topic = f"binary-{uuid.uuid4().hex[:6]}"
    await active_assets(airflow.airflow_dsn, topic)
    admin = AdminClient({"bootstrap.servers": kafka.address})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(30)
    sent = [(b"\xff\x00key", b"text value"), (b"text key", b"\xfe\xff binary"),
            (None, "zürich".encode()), (b"\x80", b"\x81")]
    producer = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": True})
    for key, value in sent:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0
    trigger = watching(KafkaTopicTrigger(topic=topic, bootstrap_servers=kafka.address,
                                         poll_timeout=0.2), topic)
    async with running(trigger, store) as task:
        await wait_for_keys(airflow_db, f"asset_watcher:{topic}", len(sent), store, task)
    events = await payloads(airflow.airflow_dsn, topic)
    assert [(decoded(e["key"]), decoded(e["value"])) for e in events] == sent
    assert events[0]["value"] == "text value"  # a text field stays text beside a binary one
    assert events[1]["key"] == "text key"
    assert all("encoding" not in e for e in events)


async def test_each_redis_field_says_its_encoding(
        redis_broker: QueueBroker, airflow: Deployment, airflow_db: str,
        store: StateStore) -> None:
    stream = f"binary-{uuid.uuid4().hex[:8]}"
    await active_assets(airflow.airflow_dsn, stream)
    client = redis.Redis(host="127.0.0.1", port=redis_broker.port)
    client.xadd(stream, {"text": "hello", "bin": b"\xff\x01", b"\xfe": "named in binary"})
    client.close()
    trigger = watching(RedisStreamTrigger(stream=stream, url=f"redis://{redis_broker.address}/0",
                                          block_ms=100), stream)
    async with running(trigger, store) as task:
        await wait_for_keys(airflow_db, f"asset_watcher:{stream}", 1, store, task)
    [event] = await payloads(airflow.airflow_dsn, stream)
    assert event["fields"] == {
        "text": "hello", "bin": {"base64": base64.b64encode(b"\xff\x01").decode()},
        "base64:" + base64.b64encode(b"\xfe").decode(): "named in binary"}
    assert "encoding" not in event


async def test_sqs_binary_attributes_say_their_encoding(
        sqs_broker: QueueBroker, airflow: Deployment, airflow_db: str, store: StateStore,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    await active_assets(airflow.airflow_dsn, "sqs-binary")
    endpoint = f"http://{sqs_broker.address}"
    async with get_session().create_client("sqs", endpoint_url=endpoint, **AWS) as sqs:
        url = (await sqs.create_queue(QueueName=f"binary-{uuid.uuid4().hex[:8]}"))["QueueUrl"]
        await sqs.send_message(QueueUrl=url, MessageBody="body text", MessageAttributes={
            "raw": {"DataType": "Binary", "BinaryValue": b"\xff\x00"},
            "name": {"DataType": "String", "StringValue": "text"}})
    trigger = watching(SqsQueueTrigger(queue_url=url, aws_conn_id=None, endpoint_url=endpoint,
                                       region_name="us-east-1", wait_seconds=0), "sqs-binary")
    async with running(trigger, store) as task:
        await wait_for_keys(airflow_db, "asset_watcher:sqs-binary", 1, store, task)
    [event] = await payloads(airflow.airflow_dsn, "sqs-binary")
    assert event["body"] == "body text"
    attributes = event["message_attributes"]
    assert decoded(attributes["raw"]["BinaryValue"]) == b"\xff\x00"
    assert attributes["name"]["StringValue"] == "text"
