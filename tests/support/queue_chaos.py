"""The message-queue scenario of the events chaos harness (tests/support/events_chaos.py): real
brokers (Tansu for Kafka, ``redis-server``, moto's SQS server), localstate's queue watchers beside
Airflow's own ``MessageQueueTrigger`` on the same brokers, under the same faults.

Item n is produced, once, into each source:

* Kafka: topic ``numbers`` (3 partitions), message ``n`` to partition ``n % 3``, its key
  ``0xff`` and ``n`` (not UTF-8: the event's key is ``{"base64": ...}``, its value text).
  localstate: one `KafkaTopicTrigger` (connection ``kafka_default``) routed by parity to the assets
  ``emit_kafka_even`` and ``emit_kafka_odd`` (fan-out; in order per partition). Airflow:
  ``MessageQueueTrigger(scheme="kafka")`` (the provider's ``AwaitMessageTrigger``, its own
  consumer group) into ``plain_kafka``;
* Redis: stream ``numbers``, each entry with a binary field beside ``n`` (localstate's
  `RedisStreamTrigger` into ``emit_redis``, in order)
  and channel ``numbers`` (Airflow's ``redis+pubsub`` trigger into ``plain_redis``: Airflow has
  no Redis Streams trigger);
* SQS: queue ``numbers`` (localstate's `SqsQueueTrigger` into ``emit_sqs``; SQS promises no
  order) and queue ``numbers-plain`` (Airflow's ``sqs`` trigger into ``plain_sqs``: both delete
  what they read, so each has its own queue).

Every process runs under the triggerers' ``conflict_policy`` as the deployment guide gives it
(``asset_watcher:*=max:position, *=reject``), read from docs/deploy.md.

Source faults: Redis killed (SIGKILL) and restarted (its append-only file keeps the stream),
the SQS endpoint frozen (SIGSTOP) for 5 s and resumed (moto keeps its queues only in memory,
so a restart would lose them), and the Kafka broker frozen for 8 s, past the watcher's
librdkafka request timeout (``socket.timeout.ms`` 3 s in its connection): a freeze, not a
restart, since Tansu keeps data across a restart only on ``s3://`` storage. The producer
holds off while a source fault runs, so an item is never produced twice by a retried call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import boto3
import redis
from airflow_harness import ROOT
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from events_chaos import Scenario

from localstate._testing.queue_broker import QueueBroker, moto_server, redis_server, tansu

PARTITIONS = 3
REGION = "us-east-1"

DAG = """
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

from localstate.airflow.queues import KafkaTopicTrigger, RedisStreamTrigger, SqsQueueTrigger

kafka = KafkaTopicTrigger(topic="numbers", route="e2e_queue_functions.by_parity",
                          poll_timeout=0.5)
emit = [
    Asset(name="emit_kafka_even", uri="localstate-e2e://kafka/even",
          watchers=[AssetWatcher(name="emit_kafka_even_watcher", trigger=kafka)]),
    Asset(name="emit_kafka_odd", uri="localstate-e2e://kafka/odd",
          watchers=[AssetWatcher(name="emit_kafka_odd_watcher", trigger=kafka)]),
    Asset(name="emit_redis", uri="localstate-e2e://redis/numbers",
          watchers=[AssetWatcher(name="emit_redis_watcher", trigger=RedisStreamTrigger(
              stream="numbers", block_ms=500))]),
    Asset(name="emit_sqs", uri="localstate-e2e://sqs/numbers",
          watchers=[AssetWatcher(name="emit_sqs_watcher", trigger=SqsQueueTrigger(
              queue_url={sqs_url!r}, wait_seconds=1, visibility_timeout=20))]),
]
plain = [
    Asset(name="plain_kafka", uri="localstate-e2e://plain/kafka",
          watchers=[AssetWatcher(name="plain_kafka_watcher", trigger=MessageQueueTrigger(
              scheme="kafka", topics=["numbers"], kafka_config_id="kafka_plain",
              apply_function="e2e_queue_functions.kafka_item", poll_timeout=0.5,
              poll_interval=0.1))]),
    Asset(name="plain_redis", uri="localstate-e2e://plain/redis",
          watchers=[AssetWatcher(name="plain_redis_watcher", trigger=MessageQueueTrigger(
              scheme="redis+pubsub", channels=["numbers"], poll_interval=0.05))]),
    Asset(name="plain_sqs", uri="localstate-e2e://plain/sqs",
          watchers=[AssetWatcher(name="plain_sqs_watcher", trigger=MessageQueueTrigger(
              scheme="sqs", sqs_queue={plain_sqs_url!r}, max_messages=10,
              wait_time_seconds=1, waiter_delay=1))]),
]
with DAG(dag_id="localstate_events_chaos", schedule=emit, catchup=False):
    pass
with DAG(dag_id="plain_events_chaos", schedule=plain, catchup=False):
    pass
"""


def documented_conflict_policy() -> str:
    """The triggerers' ``conflict_policy`` as the deployment guide gives it."""
    [policy] = re.findall(r"^conflict_policy = (.+)$", (ROOT / "docs" / "deploy.md").read_text(),
                          re.M)
    return str(policy)


def _kafka_items(name: str, extra: dict[str, Any]) -> list[int] | None:
    payload = extra.get("payload")
    if not isinstance(payload, dict):
        return None
    if name.startswith("emit_kafka"):
        n = int(payload["value"])
        if payload["key"] != {"base64": base64.b64encode(b"\xff" + str(n).encode()).decode()}:
            return None  # a key decoded wrong: a bad extra
        return [n]
    if name == "emit_redis":
        n = int(payload["fields"]["n"])
        raw = {"base64": base64.b64encode(b"\xfe\x00" + str(n).encode()).decode()}
        return [n] if payload["fields"]["raw"] == raw else None
    if name == "emit_sqs":
        return [int(json.loads(payload["body"])["n"])]
    if name == "plain_kafka":
        return [int(payload["n"])]
    if name == "plain_redis":
        return [int(payload["data"])]
    if name == "plain_sqs":
        return [int(json.loads(m["Body"])["n"]) for m in payload.get("message_batch", [])]
    return None


def _lane(name: str, n: int) -> int | None:
    if "kafka" in name:
        return n % PARTITIONS  # Kafka keeps order within a partition
    if "redis" in name:
        return 0
    return None  # SQS (standard queues) promises no order


def _expected(fed: int) -> dict[str, list[int]]:
    items = list(range(1, fed + 1))
    return {
        "emit_kafka_even": [n for n in items if n % 2 == 0],
        "emit_kafka_odd": [n for n in items if n % 2 == 1],
        "emit_redis": items, "emit_sqs": items,
        "plain_kafka": items, "plain_redis": items, "plain_sqs": items,
    }


@contextmanager
def queue_scenario(log_dir: Any) -> Iterator[tuple[Scenario, dict[str, QueueBroker]]]:
    """The brokers started, the sources made, and the scenario over them; brokers stopped
    after."""
    with ExitStack() as stack:
        kafka = stack.enter_context(tansu(log_dir))
        rds = stack.enter_context(redis_server(log_dir))
        moto = stack.enter_context(moto_server(log_dir))
        admin = AdminClient({"bootstrap.servers": kafka.address})
        for f in admin.create_topics([NewTopic("numbers", PARTITIONS, 1)]).values():
            f.result(30)
        producer = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": True})
        red = redis.Redis(host="127.0.0.1", port=rds.port, socket_timeout=10)
        sqs = boto3.client("sqs", region_name=REGION, endpoint_url=f"http://{moto.address}",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        sqs_url = sqs.create_queue(QueueName="numbers")["QueueUrl"]
        plain_sqs_url = sqs.create_queue(QueueName="numbers-plain")["QueueUrl"]
        stack.callback(red.close)
        fault = asyncio.Lock()

        def produce_sync(n: int) -> None:
            producer.produce("numbers", value=str(n).encode(), key=b"\xff" + str(n).encode(),
                             partition=n % PARTITIONS)
            assert producer.flush(30) == 0, f"Kafka did not take item {n}"
            with red.pipeline(transaction=True) as pipe:
                pipe.xadd("numbers", {"n": str(n), "raw": b"\xfe\x00" + str(n).encode()})
                pipe.publish("numbers", str(n))
                pipe.execute()
            body = json.dumps({"n": n})
            sqs.send_message(QueueUrl=sqs_url, MessageBody=body)
            sqs.send_message(QueueUrl=plain_sqs_url, MessageBody=body)

        async def produce(n: int) -> None:
            async with fault:
                await asyncio.to_thread(produce_sync, n)

        async def restart_redis() -> None:
            async with fault:
                await asyncio.to_thread(rds.restart)

        async def freeze_kafka() -> None:
            async with fault:
                assert kafka.process is not None
                os.killpg(kafka.process.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(8)
                finally:
                    os.killpg(kafka.process.pid, signal.SIGCONT)

        async def freeze_sqs() -> None:
            async with fault:
                assert moto.process is not None
                os.killpg(moto.process.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(5)
                finally:
                    os.killpg(moto.process.pid, signal.SIGCONT)

        aws = {"conn_type": "aws", "login": "testing", "password": "testing",
               "extra": {"region_name": REGION, "endpoint_url": f"http://{moto.address}"}}
        env = {
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({
                "conn_type": "kafka", "extra": {"bootstrap.servers": kafka.address,
                                                "socket.timeout.ms": 3000}}),
            "AIRFLOW_CONN_KAFKA_PLAIN": json.dumps({"conn_type": "kafka", "extra": {
                "bootstrap.servers": kafka.address, "group.id": "airflow-plain",
                "auto.offset.reset": "earliest", "session.timeout.ms": 6000}}),
            "AIRFLOW_CONN_REDIS_DEFAULT": f"redis://127.0.0.1:{rds.port}/0",
            "AIRFLOW_CONN_AWS_DEFAULT": json.dumps(aws),
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AIRFLOW__LOCALSTATE__CONFLICT_POLICY": documented_conflict_policy(),
        }
        scenario = Scenario(
            dag=DAG.format(sqs_url=sqs_url, plain_sqs_url=plain_sqs_url),
            # the Kafka trigger watches two assets: 7 watchers, 6 triggers
            watchers=7, triggers=6, produce=produce, expected=_expected, items=_kafka_items,
            lane=_lane, env=env,
            source_faults={"Redis killed and restarted": restart_redis,
                           "SQS endpoint frozen 5 s": freeze_sqs,
                           "Kafka broker frozen 8 s": freeze_kafka})
        yield scenario, {"kafka": kafka, "redis": rds, "sqs": moto}
