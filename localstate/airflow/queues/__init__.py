"""Asset Watchers for message queues, one asset event per message: `KafkaTopicTrigger`,
`RedisStreamTrigger` (exactly once) and `SqsQueueTrigger` (effectively once).

Each is used where ``MessageQueueTrigger`` goes, in an ``AssetWatcher``::

    from localstate.airflow.queues import KafkaTopicTrigger

    orders = Asset("orders", watchers=[AssetWatcher(
        name="orders_watcher", trigger=KafkaTopicTrigger(topic="orders"))])

The position in the queue (Kafka offsets, the stream's last id) is the watermark, committed
with the batch's events in one transaction (`StateEnabledTrigger.emit_many`): a crash, a
restart or a takeover by another triggerer neither loses a message's event nor repeats it.
An SQS message is deleted only once its event is committed centrally, and a redelivered one is
de-duplicated by its MessageId. They need ``[localstate] sink = api`` (or ``sql`` on Airflow's
metadata DB). A `route` function sends each message to some of the assets watched by the same
trigger (fan-out); a message the source no longer holds is `SourcePositionLost`.
"""

from __future__ import annotations

from localstate.airflow.queues._kafka import KafkaTopicTrigger
from localstate.airflow.queues._message import QueueMessage
from localstate.airflow.queues._redis import RedisStreamTrigger
from localstate.airflow.queues._sqs import SqsQueueTrigger

__all__ = ["KafkaTopicTrigger", "QueueMessage", "RedisStreamTrigger", "SqsQueueTrigger"]
