"""`KafkaTopicTrigger` against a real Kafka-protocol broker (Tansu) and a real central DB: one
event per message keyed ``topic/partition/offset``, in order per partition, a poll's batch in
one local commit, resumed on another triggerer from the watermark (assign + seek, no group),
and an offset out of range as `SourcePositionLost`."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from conftest import StoreFactory
from queue_watchers import committed_keys, running, wait_for_keys, wait_for_watermark

from localstate._metrics import MetricsReporter, statsd_segment
from localstate._testing.queue_broker import QueueBroker, tansu
from localstate.airflow.queues import KafkaTopicTrigger
from localstate.airflow.queues._kafka import check_message_error
from localstate.errors import InvalidInput, SourcePositionLost

PARTITIONS = 3

pytestmark = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueBroker]:
    with tansu(tmp_path_factory.mktemp("tansu")) as b:
        yield b


def new_topic(broker: QueueBroker) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.address})
    for f in admin.create_topics([NewTopic(name, PARTITIONS, 1)]).values():
        f.result(30)
    return name


def produce(broker: QueueBroker, topic: str, numbers: range) -> None:
    """Numbered messages, message n to partition n % PARTITIONS."""
    producer = Producer({"bootstrap.servers": broker.address, "enable.idempotence": True,
                         "linger.ms": 5})
    for n in numbers:
        producer.produce(topic, value=str(n).encode(), key=f"k{n}".encode(),
                         partition=n % PARTITIONS)
    assert producer.flush(30) == 0


def expected_keys(topic: str, numbers: range) -> dict[int, list[str]]:
    """Each partition's keys, in offset order, for messages `numbers` produced from 1."""
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for n in numbers:
        p = n % PARTITIONS
        out[p].append(f"{topic}/{p}/{len(out[p])}")
    return out


def by_partition(keys: list[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for k in keys:
        out[int(k.split("/")[1])].append(k)
    return out


async def test_each_message_is_one_event_in_partition_order_and_a_poll_is_one_commit(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    topic = new_topic(broker)
    produce(broker, topic, range(1, 601))
    store = await open_store(flush_interval=0.2)
    trigger = KafkaTopicTrigger(topic=topic, bootstrap_servers=broker.address,
                                max_messages=200, poll_timeout=0.2)
    owner = trigger.state_owner
    cache = store.local_cache
    assert cache is not None
    async with running(trigger, store) as task:
        keys = await wait_for_keys(central_url, owner, 600, store, task)
        commits = cache.commits
    assert len(keys) == len(set(keys)) == 600
    assert by_partition(keys) == expected_keys(topic, range(1, 601))
    # batches of up to 200 messages: far fewer local commits than messages (one per poll,
    # plus the flushes' mark-clean commits)
    assert commits < 600 / 10, commits
    watermark = await store.get(owner, "watermark")
    assert watermark == {str(p): 200 for p in range(PARTITIONS)}


async def test_another_triggerer_resumes_from_the_watermark_without_repeats(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    topic = new_topic(broker)
    produce(broker, topic, range(1, 301))
    first = await open_store(triggerer_id="first", flush_interval=0.2)
    trigger = KafkaTopicTrigger(topic=topic, bootstrap_servers=broker.address,
                                max_messages=50, poll_timeout=0.2)
    owner = trigger.state_owner
    async with running(trigger, first) as task:
        await wait_for_keys(central_url, owner, 300, first, task)
    await first.close()
    produce(broker, topic, range(301, 451))
    # the same trigger (same kwargs: same owner) on another triggerer, its own cache file
    second = await open_store(triggerer_id="second", flush_interval=0.2)
    moved = KafkaTopicTrigger(topic=topic, bootstrap_servers=broker.address,
                              max_messages=50, poll_timeout=0.2)
    assert moved.state_owner == owner
    async with running(moved, second) as task:
        keys = await wait_for_keys(central_url, owner, 450, second, task)
        await asyncio.sleep(0.5)  # nothing more arrives: no replay of the first 300
        await second.flush()
    keys = await committed_keys(central_url, owner)
    assert len(keys) == len(set(keys)) == 450
    assert by_partition(keys) == expected_keys(topic, range(1, 451))


async def test_a_crash_before_the_flush_loses_and_repeats_nothing(
        broker: QueueBroker, open_store: StoreFactory, central_url: str,
        tmp_path: Path) -> None:
    """Events committed locally but not yet centrally when the process dies go out from the
    reopened cache file; the trigger resumes past them."""
    topic = new_topic(broker)
    produce(broker, topic, range(1, 121))
    cache_path = tmp_path / "crash.db"
    store = await open_store(triggerer_id="crashing", cache_path=cache_path,
                             flush_interval=3600)
    trigger = KafkaTopicTrigger(topic=topic, bootstrap_servers=broker.address,
                                poll_timeout=0.2)
    owner = trigger.state_owner
    async with running(trigger, store):
        await wait_for_watermark(store, owner, {str(p): 40 for p in range(PARTITIONS)})
        await store.sync_local()
    assert await committed_keys(central_url, owner) == []  # nothing flushed yet
    await store.close(timeout=0)  # stands for the crash: the cache file holds the outbox
    produce(broker, topic, range(121, 151))
    again = await open_store(triggerer_id="crashing", cache_path=cache_path,
                             flush_interval=0.2)
    resumed = KafkaTopicTrigger(topic=topic, bootstrap_servers=broker.address,
                                poll_timeout=0.2)
    async with running(resumed, again) as task:
        keys = await wait_for_keys(central_url, owner, 150, again, task)
    assert len(keys) == len(set(keys)) == 150
    assert by_partition(keys) == expected_keys(topic, range(1, 151))


async def test_an_offset_out_of_range_is_a_typed_error(backend: str) -> None:
    """librdkafka's answer to a fetch of an offset the partition no longer holds (with
    ``auto.offset.reset = error``) stops the watcher loudly, naming the partition and offset.
    (Tansu keeps every message and refuses DeleteRecords, so the broker side of retention
    cannot be produced here; the consumer's error object is the real one.)"""
    for code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
        message = Message(topic="orders", partition=2, offset=-1001, error=KafkaError(code))
        with pytest.raises(SourcePositionLost, match=r"offset 17 of orders partition 2") as e:
            check_message_error(message, {2: 17})
        assert (e.value.source, e.value.position) == ("orders/2", 17)
    assert check_message_error(Message(topic="orders", partition=0, offset=3), {}) is False
    transient = Message(topic="orders", partition=0, error=KafkaError(KafkaError._TRANSPORT))
    assert check_message_error(transient, {}) is True


def test_bad_arguments_are_refused_when_the_dag_is_parsed(backend: str) -> None:
    with pytest.raises(InvalidInput, match="topic"):
        KafkaTopicTrigger(topic="")
    with pytest.raises(InvalidInput, match="max_messages"):
        KafkaTopicTrigger(topic="t", max_messages=0)
    with pytest.raises(InvalidInput, match="cannot be imported"):
        KafkaTopicTrigger(topic="t", route="no_such_module.route")
    classpath, kwargs = KafkaTopicTrigger(topic="t", partitions=[2, 0]).serialize()
    assert classpath == "localstate.airflow.queues.KafkaTopicTrigger"
    assert kwargs["partitions"] == [0, 2]
    assert KafkaTopicTrigger(**kwargs).serialize() == (classpath, kwargs)


async def test_a_broker_down_when_the_trigger_starts_is_waited_for(
        open_store: StoreFactory, central_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens at the bootstrap address when the trigger starts: it waits, logging
    what it cannot reach, and reads the topic once the broker is up (and the topic made)."""
    down = tansu(tmp_path)  # not started
    store = await open_store(flush_interval=0.2)
    trigger = KafkaTopicTrigger(topic="late", bootstrap_servers=down.address, poll_timeout=0.2)
    owner = trigger.state_owner
    caplog.set_level(logging.INFO, "localstate.airflow.queues.kafka")
    async with running(trigger, store) as task:
        for _ in range(600):
            assert not task.done(), task.exception() if task.done() else None
            if any(down.address in r.getMessage() and "cannot be reached" in r.getMessage()
                   for r in caplog.records):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no log line says the broker cannot be reached")
        await asyncio.sleep(1.0)  # a few more tries, still waiting
        assert not task.done()
        with down:
            admin = AdminClient({"bootstrap.servers": down.address})
            for f in admin.create_topics([NewTopic("late", PARTITIONS, 1)]).values():
                f.result(30)
            produce(down, "late", range(1, 31))
            keys = await wait_for_keys(central_url, owner, 30, store, task)
    assert by_partition(keys) == expected_keys("late", range(1, 31))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"Kafka {down.address} (topic late)" in warnings[0]
    assert any("recovered after" in r.getMessage() for r in caplog.records)


def group_offsets(broker: QueueBroker, topic: str) -> dict[int, int]:
    """The offsets the trigger's consumer group has committed (-1001: none)."""
    reader = Consumer({"bootstrap.servers": broker.address, "group.id": f"localstate-{topic}"})
    try:
        got = reader.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                               timeout=30)
    finally:
        reader.close()
    return {tp.partition: tp.offset for tp in got}


async def test_the_group_offsets_follow_the_central_position_and_the_lag_is_reported(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    """Lag tools read the group's committed offsets: they are committed once the central DB
    holds the position (not before), equal to it; the trigger's lag is in its figures."""
    topic = new_topic(broker)
    produce(broker, topic, range(1, 91))
    store = await open_store(flush_interval=3600)  # flushed by the test only
    trigger = KafkaTopicTrigger(topic=topic, bootstrap_servers=broker.address,
                                poll_timeout=0.2)
    owner = trigger.state_owner
    async with running(trigger, store):
        await wait_for_watermark(store, owner, {str(p): 30 for p in range(PARTITIONS)})
        await asyncio.sleep(1.0)  # polls go on: no commit while the position is local only
        assert set(group_offsets(broker, topic).values()) == {OFFSET_INVALID}
        await store.flush()
        for _ in range(300):
            if group_offsets(broker, topic) == dict.fromkeys(range(PARTITIONS), 30):
                break
            await asyncio.sleep(0.1)
        assert group_offsets(broker, topic) == dict.fromkeys(range(PARTITIONS), 30)
        assert store.stats().sources_by_owner[owner]["lag"] == 0
        produce(broker, topic, range(91, 121))
        await wait_for_watermark(store, owner, {str(p): 40 for p in range(PARTITIONS)})
        await store.flush()
        for _ in range(300):
            if group_offsets(broker, topic) == dict.fromkeys(range(PARTITIONS), 40):
                break
            await asyncio.sleep(0.1)
        assert group_offsets(broker, topic) == dict.fromkeys(range(PARTITIONS), 40)
    reporter = MetricsReporter(store, interval=60)
    gauges = reporter.sample().gauges
    assert gauges["queue.lag"] == 0
    assert gauges[f"queue.owner_lag.{statsd_segment(owner)}"] == 0


class GrowingTopic(KafkaTopicTrigger):
    """Tansu refuses CreatePartitions, so partitions cannot be added to a topic here: this
    trigger's metadata shows the first `visible` partitions of its real topic (3), and the test
    shows more while it runs, as the broker's metadata would after an ``--alter
    --partitions``. Everything else (the assignment, the fetches, the emits) is the real
    trigger's against the real broker."""

    visible = 1

    def _partitions(self, consumer: Any) -> list[int]:
        return super()._partitions(consumer)[:self.visible]


async def test_partitions_added_while_running_are_read_from_their_first_offset(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    topic = new_topic(broker)
    produce(broker, topic, range(1, 61))
    store = await open_store(flush_interval=0.2)
    trigger = GrowingTopic(topic=topic, bootstrap_servers=broker.address, poll_timeout=0.2,
                           metadata_refresh=0.5)
    owner = trigger.state_owner
    async with running(trigger, store) as task:
        await wait_for_watermark(store, owner, {"0": 20})
        await asyncio.sleep(1.5)  # three refreshes: still one partition
        assert await store.get(owner, "watermark") == {"0": 20}
        trigger.visible = PARTITIONS  # two partitions "added", each with 20 messages
        keys = await wait_for_keys(central_url, owner, 60, store, task)
        produce(broker, topic, range(61, 91))
        keys = await wait_for_keys(central_url, owner, 90, store, task)
    assert len(keys) == len(set(keys)) == 90
    assert by_partition(keys) == expected_keys(topic, range(1, 91))
