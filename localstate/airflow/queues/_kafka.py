"""`KafkaTopicTrigger`: one asset event per Kafka message, exactly once.

The watermark is the next offset to read of each partition (``{"0": 120, "1": 97}``). The
trigger assigns itself the partitions and seeks each to its watermark (no consumer-group
join, so no rebalance wait after a crash or a takeover), reads batches with confluent-kafka,
and emits each batch with the watermark past it as one commit (`emit_batch`). The event key is
``topic/partition/offset``. The group's committed offset is never read: the watermark, in the
events' own transaction, is the position. It is written, for lag tools: once the central DB
holds a position (no event of the trigger's owners is pending any more), the same offsets are
committed to the group (`group_commit`), and the messages behind the partitions' high
watermarks are the owner's ``lag`` (`StateStore.sources`, the metric ``queue.owner_lag``).

A broker that cannot be reached, when the trigger starts or later, is waited for: the topic's
partitions and the retention check are retried with backoff, and the consumer's transport
errors while it reads are librdkafka's to retry; either way one WARNING says what is out of
reach, a summary every minute how long for, and an INFO when it is back (`FailureLog`, as
for the central DB). A topic that does not exist (yet) is waited for the same way.

A watermark below what a partition still holds (retention deleted messages not yet read) is a
`SourcePositionLost`: the trigger fails loudly instead of skipping them or replaying the topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from airflow.triggers.base import TriggerEvent

from localstate._core.backoff import Backoff
from localstate._core.failure_log import FailureLog
from localstate._core.swallowed_cancel import raise_swallowed_cancel
from localstate.airflow.queues._message import QueueMessage, field_value
from localstate.airflow.queues._queue_trigger import QueueTrigger
from localstate.errors import ConfigError, InvalidInput, SourcePositionLost

__all__ = ["KafkaTopicTrigger", "check_message_error"]

log = logging.getLogger("localstate.airflow.queues.kafka")

_T = TypeVar("_T")
#: the longest wait between two tries of a broker that cannot be reached
RETRY_CAP = 10.0


def check_message_error(message: Any, positions: dict[int, int],
                        failures: FailureLog | None = None) -> bool:
    """Raise `SourcePositionLost` for a consumer error saying an offset is out of range;
    True for a message that carries another error (logged, to `failures` when given; skipped:
    librdkafka retries), False for a message that carries none."""
    error = message.error()
    if error is None:
        return False
    # librdkafka's local error codes (a reset offset, the end of a partition) are named with a
    # leading underscore in confluent-kafka: told apart by their public `name()`
    if error.name() in ("_AUTO_OFFSET_RESET", "OFFSET_OUT_OF_RANGE"):
        partition = message.partition()
        topic = message.topic()
        raise SourcePositionLost(
            f"Kafka has no offset {positions.get(partition)} of {topic} partition "
            f"{partition} any more ({error.str()}): the messages between it and the oldest "
            "one kept were deleted by retention (or the topic was recreated) before this "
            "watcher read them. See the troubleshooting entry SourcePositionLost.",
            source=f"{topic}/{partition}", position=positions.get(partition))
    if error.fatal():
        raise ConfigError(f"the Kafka consumer failed for good: {error.str()}")
    if error.name() != "_PARTITION_EOF":
        if failures is None:
            log.warning("Kafka consumer: %s", error.str())
        else:
            failures.failed(error.str())
    return True


class KafkaTopicTrigger(QueueTrigger):
    """An Asset Watcher of a Kafka topic: one asset event per message, exactly once.

    `kafka_config_id`: the Airflow connection whose extra is the confluent-kafka config (the
    provider's ``kafka_default``); `bootstrap_servers` instead, or `config` on top of it.
    `partitions`: the partitions to read (default: all, as the topic has them when the
    trigger starts). `route`: ``package.module.function`` giving each message's asset names
    (fan-out). The event's payload holds ``topic``, ``partition``, ``offset``, ``key``,
    ``value`` (each the text when UTF-8, else ``{"base64": ...}``) and ``timestamp`` (ms).
    """

    def __init__(self, *, topic: str, kafka_config_id: str = "kafka_default",
                 bootstrap_servers: str | None = None, partitions: list[int] | None = None,
                 config: dict[str, Any] | None = None, route: str | None = None,
                 on_bad_message: str = "flag",
                 dead_letter: str | None = None,
                 max_messages: int = 500, poll_timeout: float = 1.0,
                 group_commit: bool = True, metadata_refresh: float = 5.0) -> None:
        super().__init__(route=route, max_messages=max_messages,
                         on_bad_message=on_bad_message, dead_letter=dead_letter)
        if not topic or "/" in topic:
            raise InvalidInput(f"topic must be a non-empty topic name, not {topic!r}")
        self.topic = topic
        self.kafka_config_id = kafka_config_id
        self.bootstrap_servers = bootstrap_servers
        self.partitions = None if partitions is None else sorted(set(partitions))
        self.config = dict(config or {})
        self.poll_timeout = poll_timeout
        #: commit the group's offsets once the central DB holds the position (advisory)
        self.group_commit = group_commit
        if not metadata_refresh > 0:
            raise InvalidInput(f"metadata_refresh must be seconds > 0, not {metadata_refresh!r}")
        #: seconds between two reads of the topic's partitions (new ones are read from their
        #: first offset); only when `partitions` is not given
        self.metadata_refresh = metadata_refresh

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (self.classpath(), {
            "topic": self.topic, "kafka_config_id": self.kafka_config_id,
            "bootstrap_servers": self.bootstrap_servers, "partitions": self.partitions,
            "config": self.config, "poll_timeout": self.poll_timeout, **self.common_kwargs(),
            # only when not the default: the serialized form (and so the owner) stays as it was
            **({} if self.group_commit else {"group_commit": False}),
            **({} if self.metadata_refresh == 5.0
               else {"metadata_refresh": self.metadata_refresh})})

    async def consumer_config(self) -> dict[str, Any]:
        """The confluent-kafka config: the connection's extra (unless `bootstrap_servers` is
        given), then `config`, then what this trigger needs (no auto commit, errors for an
        offset out of range)."""
        config: dict[str, Any] = {}
        if self.bootstrap_servers is None:
            from airflow.sdk import BaseHook

            conn = await BaseHook.aget_connection(self.kafka_config_id)
            config.update(conn.extra_dejson)
        else:
            config["bootstrap.servers"] = self.bootstrap_servers
        config.update(self.config)
        # never joined: its offsets are committed for lag tools only (`group_commit`)
        config.setdefault("group.id", f"localstate-{self.topic}")
        config.update({"enable.auto.commit": False, "enable.auto.offset.store": False,
                       "auto.offset.reset": "error"})
        return config

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        config = await self.consumer_config()
        consumer = await asyncio.to_thread(Consumer, config)
        polling: asyncio.Future[list[Any]] | None = None
        try:
            reach = FailureLog(log, f"Kafka {config.get('bootstrap.servers')} "
                                    f"(topic {self.topic})")
            partitions = (list(self.partitions) if self.partitions
                          else await self._reachable(reach, self._partitions, consumer))
            stored = await self.get_watermark(default=None) or {}
            positions = {p: int(stored[str(p)]) for p in partitions if str(p) in stored}
            await self._reachable(reach, self._check_retention, consumer, positions)
            consumer.assign([TopicPartition(self.topic, p, positions.get(p, OFFSET_BEGINNING))
                             for p in partitions])
            loop = asyncio.get_running_loop()
            #: the topic's partitions being read again (None: not now), and when next
            refreshing: asyncio.Future[list[int]] | None = None
            refresh_at = loop.time() + self.metadata_refresh
            store = await self.open_state()
            owners = self.event_owners()
            #: the position emitted last whose offsets the group has not been given yet
            uncommitted: dict[int, int] | None = None
            while True:
                raise_swallowed_cancel()
                if self.partitions is None:
                    if refreshing is None and loop.time() >= refresh_at:
                        refreshing = loop.run_in_executor(None, self._partitions, consumer)
                    elif refreshing is not None and refreshing.done():
                        found = self._refreshed(refreshing)
                        refreshing, refresh_at = None, loop.time() + self.metadata_refresh
                        added = sorted(set(found) - set(partitions))
                        if added:  # between polls: no consume runs while it is reassigned
                            log.info("Kafka topic %s: partitions %s added; reading them from "
                                     "their first offset", self.topic, added)
                            partitions = sorted({*partitions, *added})
                            consumer.assign([TopicPartition(self.topic, p, positions.get(
                                p, OFFSET_BEGINNING)) for p in partitions])
                polling = loop.run_in_executor(None, consumer.consume, self.max_messages,
                                               self.poll_timeout)
                batch = await asyncio.shield(polling)
                messages: list[QueueMessage] = []
                for m in batch:
                    if check_message_error(m, positions, reach):
                        continue
                    partition, offset = m.partition(), m.offset()
                    if offset < positions.get(partition, 0):
                        continue  # already emitted (a fetch that overlapped the seek)
                    positions[partition] = offset + 1
                    messages.append(self._message(m))
                if messages:
                    reach.succeeded()
                    watermark = {str(p): o for p, o in sorted(positions.items())}
                    await self.emit_batch(messages, watermark=watermark)
                    uncommitted = dict(positions)
                if uncommitted is not None and self.group_commit and \
                        not store.events_pending(owners):
                    # the central DB holds the position: the group's offsets follow it
                    self._commit_group(consumer, uncommitted)
                    uncommitted = None
                self._report_lag(consumer, store, positions)
        finally:
            # librdkafka's consumer is not to be closed mid-poll (nor mid-metadata read)
            running: list[asyncio.Future[Any]] = [
                f for f in (polling, refreshing) if f is not None]
            if running:
                await asyncio.wait(running)
            await asyncio.to_thread(consumer.close)
        yield TriggerEvent({})  # never reached: it makes run() the async generator Airflow runs

    def _message(self, m: Any) -> QueueMessage:
        partition, offset = m.partition(), m.offset()
        payload: dict[str, Any] = {
            "topic": self.topic, "partition": partition, "offset": offset,
            "key": field_value(m.key()), "value": field_value(m.value()),
            "timestamp": m.timestamp()[1]}
        return QueueMessage("kafka", self.topic, f"{self.topic}/{partition}/{offset}", payload,
                            content=("key", "value"))

    async def _reachable(self, reach: FailureLog, call: Callable[..., _T], *args: Any) -> _T:
        """`call(*args)` in a thread, until it no longer fails for want of the broker (or the
        topic): each failure logged through `reach` and waited for with backoff."""
        from confluent_kafka import KafkaException

        backoff = Backoff(base=0.2, cap=RETRY_CAP)
        while True:
            try:
                result = await asyncio.to_thread(call, *args)
            except (KafkaException, _TopicMissing) as exc:
                delay = backoff.next_delay()
                reach.failed(f"cannot be reached: {exc}" if isinstance(exc, KafkaException)
                             else str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                continue
            reach.succeeded()
            return result

    def _refreshed(self, refreshing: asyncio.Future[list[int]]) -> list[int]:
        """The partitions a metadata read found (none when it failed: the next one retries;
        the consumer's own errors say when the broker is out of reach)."""
        try:
            return refreshing.result()
        except Exception as exc:  # a broker or a topic out of reach: not the trigger's end
            log.debug("Kafka topic %s: reading its partitions failed: %s", self.topic, exc)
            return []

    def _commit_group(self, consumer: Any, positions: dict[int, int]) -> None:
        """Give the consumer group `positions` (advisory: what lag tools read; the watermark
        stays the position). Asynchronous: a failed commit is logged by librdkafka and the
        next flush's commit supersedes it."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            consumer.commit(offsets=[TopicPartition(self.topic, p, o)
                                     for p, o in sorted(positions.items())], asynchronous=True)
        except KafkaException as exc:  # advisory: never the trigger's end
            log.debug("Kafka group commit of %s failed: %s", self.topic, exc)

    def _report_lag(self, consumer: Any, store: Any, positions: dict[int, int]) -> None:
        """The messages behind each assigned partition's high watermark, summed, as the
        owner's ``lag`` (the metric ``queue.lag``), from the consumer's cached watermarks."""
        from confluent_kafka import TopicPartition

        total = 0
        for tp in consumer.assignment():
            _low, high = consumer.get_watermark_offsets(TopicPartition(self.topic,
                                                                       tp.partition),
                                                        cached=True)
            if high is None or high < 0:
                continue  # not fetched yet
            total += max(0, high - positions.get(tp.partition, 0))
        store.sources.gauge(self.state_owner, "lag", total)

    def _partitions(self, consumer: Any) -> list[int]:
        metadata = consumer.list_topics(self.topic, timeout=10)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise _TopicMissing(f"Kafka topic {self.topic!r} does not exist or has no "
                                f"partitions ({None if topic is None else topic.error}); "
                                "waiting for it")
        return sorted(topic.partitions)

    def _check_retention(self, consumer: Any, positions: dict[int, int]) -> None:
        """`SourcePositionLost` when a partition no longer holds its watermark's offset."""
        from confluent_kafka import TopicPartition

        for partition, offset in positions.items():
            low, _high = consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=10)
            if offset < low:
                raise SourcePositionLost(
                    f"Kafka's {self.topic} partition {partition} starts at offset {low} now, "
                    f"past this watcher's watermark {offset}: {low - offset} messages were "
                    "deleted by retention before it read them. See the troubleshooting entry "
                    "SourcePositionLost.", source=f"{self.topic}/{partition}", position=offset,
                    earliest=low)


class _TopicMissing(ConfigError):
    """The topic is not there (yet): waited for, as a broker out of reach is."""
