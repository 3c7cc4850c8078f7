"""The message-queue scenario of the events chaos harness (tests/support/events_chaos.py): real
brokers (Tansu for Kafka, ``redis-server``, moto's SQS server), localstate's queue watchers beside
Airflow's own ``MessageQueueTrigger`` on the same brokers, under the same faults.

Item n is produced, once, into each source:

* Kafka: topic ``numbers`` (3 partitions), message ``n`` to partition ``n % 3``, its key
  ``0xff`` and ``n`` (not UTF-8: the event's key is ``{"base64": ...}``, its value text).
  localstate: one `KafkaTopicTrigger` (connection ``kafka_default``) routed by parity to the assets
  ``emit_kafka_even`` and ``emit_kafka_odd`` (fan-out; in order per partition), with the
  dead-letter asset ``emit_kafka_dead``. Airflow:
  ``MessageQueueTrigger(scheme="kafka")`` (the provider's ``AwaitMessageTrigger``, its own
  consumer group) into ``plain_kafka``;
* Redis: stream ``numbers``, each entry with a binary field beside ``n`` (localstate's
  `RedisStreamTrigger`, its route checking ``n``, into ``emit_redis``, in order)
  and channel ``numbers`` (Airflow's ``redis+pubsub`` trigger into ``plain_redis``: Airflow has
  no Redis Streams trigger);
* SQS: queue ``numbers`` (localstate's `SqsQueueTrigger` into ``emit_sqs``; SQS promises no
  order) and queue ``numbers-plain`` (Airflow's ``sqs`` trigger into ``plain_sqs``: both delete
  what they read, so each has its own queue).

Some items are bad messages, each with the event the documented policy (``on_bad_message``
``flag``, docs/guides/queues/) gives it:

* `oversize` items (n % 20 == 7): the Kafka message's value and a field of the Redis entry
  are padded past ``max_value_bytes`` (64 KiB): the event, to the assets the route gives
  (Kafka: by n's parity), has the message's coordinates and ``"omitted": "too_large"``,
  not its content; the item is known by its coordinates (the offset or the entry id the
  producer got back);
* `malformed` items (n % 20 == 13): the Kafka value and the Redis field ``n`` are ``#<n>``,
  on which the route raises: the event, whole, with ``route_error``, goes to the Kafka
  trigger's dead-letter asset, not to even/odd; the Redis trigger (a route that checks each
  entry, no ``dead_letter``) gives it to its own record, its one asset ``emit_redis``.

An event whose flags do not match its item's kind counts as a bad extra.

Every process runs under the triggerers' ``conflict_policy`` as the deployment guide gives it
(``asset_watcher:*=max:position, *=reject``), read from docs/deploy.md.

Source faults: Redis killed (SIGKILL) and restarted (its append-only file keeps the stream),
the SQS endpoint frozen (SIGSTOP) for 5 s and resumed (moto keeps its queues only in memory,
so a restart would lose them), and the Kafka broker frozen for 8 s, past the watcher's
librdkafka request timeout (``socket.timeout.ms`` 3 s in its connection): a freeze, not a
restart, since Tansu keeps data across a restart only on ``s3://`` storage; and the Kafka
broker unreachable (frozen) while the triggerer running the Kafka watcher is SIGKILLed and
restarted: the trigger starts again, in one of the triggerers, while the broker does not
answer, and the broker is resumed once the watcher has logged that it cannot be reached. The
producer holds off while a source fault runs, so an item is never produced twice by a retried call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import redis
from airflow_harness import ROOT
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from events_chaos import Run, Scenario

from localstate._testing.queue_broker import QueueBroker, moto_server, redis_server, tansu

PARTITIONS = 3
#: bytes of padding of an oversize item: over max_value_bytes (64 KiB by default)
PAD = 80_000
REGION = "us-east-1"

DAG = """
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

from localstate.airflow.queues import KafkaTopicTrigger, RedisStreamTrigger, SqsQueueTrigger

kafka = KafkaTopicTrigger(topic="numbers", route="e2e_queue_functions.by_parity",
                          dead_letter="emit_kafka_dead", poll_timeout=0.5)
emit = [
    Asset(name="emit_kafka_even", uri="localstate-e2e://kafka/even",
          watchers=[AssetWatcher(name="emit_kafka_even_watcher", trigger=kafka)]),
    Asset(name="emit_kafka_odd", uri="localstate-e2e://kafka/odd",
          watchers=[AssetWatcher(name="emit_kafka_odd_watcher", trigger=kafka)]),
    Asset(name="emit_kafka_dead", uri="localstate-e2e://kafka/dead",
          watchers=[AssetWatcher(name="emit_kafka_dead_watcher", trigger=kafka)]),
    Asset(name="emit_redis", uri="localstate-e2e://redis/numbers",
          watchers=[AssetWatcher(name="emit_redis_watcher", trigger=RedisStreamTrigger(
              stream="numbers", block_ms=500, route="e2e_queue_functions.checked_entry"))]),
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


def oversize(n: int) -> bool:
    """Item n's Kafka message and Redis entry are over max_value_bytes."""
    return n % 20 == 7


def malformed(n: int) -> bool:
    """Item n's Kafka message and Redis entry are ones the routes raise on."""
    return n % 20 == 13


def _kafka_value(n: int) -> bytes:
    if malformed(n):
        return f"#{n}".encode()
    return f"{n}:".encode() + b"x" * PAD if oversize(n) else str(n).encode()


def _redis_n(n: int) -> str:
    return f"#{n}" if malformed(n) else str(n)


def _too_large(payload: dict[str, Any], content: str) -> bool:
    """The event of a message over max_value_bytes, as the policy makes it."""
    return (payload.get("omitted") == "too_large" and int(payload["size"]) > PAD
            and content not in payload)


def _sent(payload: dict[str, Any], content: str) -> bool:
    """An event with the message's content, not flagged too large."""
    return "omitted" not in payload and content in payload


class _Coordinates:
    """Where the producer's messages landed: (partition, offset) of each Kafka message and
    the id of each Redis entry, to know an oversize item's event (its content left out)."""

    def __init__(self) -> None:
        self.kafka: dict[tuple[int, int], int] = {}
        self.redis: dict[str, int] = {}

    def items(self, name: str, extra: dict[str, Any]) -> list[int] | None:
        payload = extra.get("payload")
        if not isinstance(payload, dict):
            return None
        if name.startswith("emit_kafka"):
            return self._kafka(name, payload)
        if name == "emit_redis":
            return self._redis(payload)
        return _sqs_and_plain_items(name, payload)

    def _kafka(self, name: str, payload: dict[str, Any]) -> list[int] | None:
        n = self.kafka.get((int(payload["partition"]), int(payload["offset"])))
        if n is None or payload["topic"] != "numbers":
            return None
        if oversize(n):  # coordinates and size only, to the assets the route gives
            return [n] if _too_large(payload, "value") and "key" not in payload else None
        if not _sent(payload, "value") or payload["value"] != _kafka_value(n).decode():
            return None
        if payload["key"] != {"base64": base64.b64encode(b"\xff" + str(n).encode()).decode()}:
            return None  # a key decoded wrong: a bad extra
        # the route raised on a malformed one: its event, whole, to the dead-letter asset
        raised = str(payload.get("route_error", "")).startswith("ValueError: ")
        return [n] if raised == malformed(n) == (name == "emit_kafka_dead") else None

    def _redis(self, payload: dict[str, Any]) -> list[int] | None:
        n = self.redis.get(str(payload["stream"]) + "/" + str(payload["id"]))
        if n is None:
            return None
        if oversize(n):
            return [n] if _too_large(payload, "fields") else None
        if not _sent(payload, "fields") or payload["fields"]["n"] != _redis_n(n):
            return None
        raw = {"base64": base64.b64encode(b"\xfe\x00" + str(n).encode()).decode()}
        if payload["fields"]["raw"] != raw:
            return None
        # the route raised on a malformed one: its event, whole, to the trigger's own record
        raised = str(payload.get("route_error", "")).startswith("ValueError: ")
        return [n] if raised == malformed(n) else None


def _sqs_and_plain_items(name: str, payload: dict[str, Any]) -> list[int] | None:
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
        "emit_kafka_even": [n for n in items if n % 2 == 0 and not malformed(n)],
        "emit_kafka_odd": [n for n in items if n % 2 == 1 and not malformed(n)],
        "emit_kafka_dead": [n for n in items if malformed(n)],
        "emit_redis": items, "emit_sqs": items,
        "plain_kafka": items, "plain_redis": items, "plain_sqs": items,
    }


def _reach_lines(log: Any, start: int) -> int:
    """Lines of the Kafka watcher's FailureLog (the broker out of reach) in `log` past
    `start`."""
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    return sum(1 for line in text.splitlines()
               if "(topic numbers)" in line and "cannot be reached" in line)


@dataclass
class QueueChaos:
    """What `queue_scenario` gives: the scenario, its brokers, and what its faults saw."""

    scenario: Scenario
    brokers: dict[str, QueueBroker]
    #: per "Kafka broker frozen, its watcher's triggerer restarted" fault run, the lines the
    #: watcher logged saying that the broker cannot be reached
    down_at_start: list[int]


@contextmanager
def queue_scenario(log_dir: Any) -> Iterator[QueueChaos]:
    """The brokers started, the sources made, and the scenario over them; brokers stopped
    after."""
    with ExitStack() as stack:
        kafka = stack.enter_context(tansu(log_dir))
        rds = stack.enter_context(redis_server(log_dir))
        moto = stack.enter_context(moto_server(log_dir))
        admin = AdminClient({"bootstrap.servers": kafka.address})
        for f in admin.create_topics([NewTopic("numbers", PARTITIONS, 1)]).values():
            f.result(30)
        producer = Producer({"bootstrap.servers": kafka.address, "enable.idempotence": True,
                             "message.max.bytes": 4 * PAD})
        where = _Coordinates()
        red = redis.Redis(host="127.0.0.1", port=rds.port, socket_timeout=10)
        sqs = boto3.client("sqs", region_name=REGION, endpoint_url=f"http://{moto.address}",
                           aws_access_key_id="testing", aws_secret_access_key="testing")
        sqs_url = sqs.create_queue(QueueName="numbers")["QueueUrl"]
        plain_sqs_url = sqs.create_queue(QueueName="numbers-plain")["QueueUrl"]
        stack.callback(red.close)
        fault = asyncio.Lock()

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            where.kafka[(msg.partition(), msg.offset())] = int(
                msg.value().lstrip(b"#").split(b":", 1)[0])

        def produce_sync(n: int) -> None:
            producer.produce("numbers", value=_kafka_value(n), key=b"\xff" + str(n).encode(),
                             partition=n % PARTITIONS, on_delivery=delivered)
            assert producer.flush(30) == 0, f"Kafka did not take item {n}"
            fields: dict[str, str | bytes] = {"n": _redis_n(n),
                                              "raw": b"\xfe\x00" + str(n).encode()}
            if oversize(n):
                fields["pad"] = "x" * PAD
            with red.pipeline(transaction=True) as pipe:
                pipe.xadd("numbers", fields)  # type: ignore[arg-type]
                pipe.publish("numbers", str(n))
                entry, _ = pipe.execute()
            where.redis[f"numbers/{entry.decode()}"] = n
            body = json.dumps({"n": n})
            sqs.send_message(QueueUrl=sqs_url, MessageBody=body)
            sqs.send_message(QueueUrl=plain_sqs_url, MessageBody=body)

        async def produce(n: int) -> None:
            async with fault:
                await asyncio.to_thread(produce_sync, n)

        async def restart_redis(run: Run) -> None:
            async with fault:
                await asyncio.to_thread(rds.restart)

        async def freeze_kafka(run: Run) -> None:
            async with fault:
                assert kafka.process is not None
                os.killpg(kafka.process.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(8)
                finally:
                    os.killpg(kafka.process.pid, signal.SIGCONT)

        async def kafka_down_at_start(run: Run) -> None:
            """The Kafka watcher's trigger starts while the broker does not answer."""
            async with fault:
                assert kafka.process is not None
                said, started = 0, time.monotonic()
                os.killpg(kafka.process.pid, signal.SIGSTOP)
                try:
                    await run.restart_triggerer_of("emit_kafka_even")
                    # what the triggerers log from here on: from the trigger's new start
                    logs = sorted(run.d.logs.glob("triggerer-*.log"))
                    marks = {p: p.stat().st_size for p in logs}
                    # until the watcher says so (its partition list's request times out
                    # after 10 s: 13.5 s after the trigger's start in a run), at most 45 s
                    started = time.monotonic()
                    for _ in range(90):
                        said = sum(_reach_lines(p, marks[p]) for p in logs)
                        if said:
                            break
                        await asyncio.sleep(0.5)
                finally:
                    os.killpg(kafka.process.pid, signal.SIGCONT)
                run.note(f"Kafka broker resumed {time.monotonic() - started:.1f} s after the "
                         f"trigger's start; the watcher's lines of an unreachable broker: {said}")
                down_at_start.append(said)

        async def freeze_sqs(run: Run) -> None:
            async with fault:
                assert moto.process is not None
                os.killpg(moto.process.pid, signal.SIGSTOP)
                try:
                    await asyncio.sleep(5)
                finally:
                    os.killpg(moto.process.pid, signal.SIGCONT)

        #: per broker-down-at-start fault, the watcher's lines saying the broker is out of reach
        down_at_start: list[int] = []
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
            # the Kafka trigger watches three assets: 8 watchers, 6 triggers
            watchers=8, triggers=6, produce=produce, expected=_expected, items=where.items,
            lane=_lane, env=env,
            source_faults={"Redis killed and restarted": restart_redis,
                           "SQS endpoint frozen 5 s": freeze_sqs,
                           "Kafka broker frozen 8 s": freeze_kafka,
                           "Kafka broker frozen, its watcher's triggerer restarted":
                               kafka_down_at_start})
        yield QueueChaos(scenario, {"kafka": kafka, "redis": rds, "sqs": moto}, down_at_start)
