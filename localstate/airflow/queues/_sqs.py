"""`SqsQueueTrigger`: one asset event per SQS message, effectively once.

SQS has no position to keep: a message stays until it is deleted, and comes back after its
visibility timeout when it is not. So each batch received is emitted keyed by MessageId
(``sqs/<MessageId>``) with ``durability="central"`` (the call returns once the central DB has
committed the events), and only then deleted with ``DeleteMessageBatch``. A crash before the
commit: the messages come back and are emitted then. A crash between the commit and the
delete, a delete that failed (its ``Failed`` entries are logged and counted), or SQS's own
occasional second delivery: the message comes back and its event is a duplicate the central
DB drops by key. The de-duplication rows of ``sqs/`` keys stay at least as long as SQS can
redeliver (`localstate db prune` keeps them 15 days: SQS's longest retention, and a day).
That is effectively once, not exactly once: a message redelivered after its key was pruned,
or by a queue whose retention is longer than that window, would be emitted again.

The loop is a pipeline: a batch's central commit and its delete run while the next batches are
received (at most `SETTLING_BATCHES` at once; one at a time until one is committed, so that the
first emit claims the watched assets once). Waiting for each batch's commit and delete before
the next receive made a flush round trip and several SQS calls the cost of every batch, one
after the other: at a few hundred milliseconds a call (moto on a loaded machine, or a far
region) the watcher fell behind a few messages a second; with real SQS the flush round trip
alone capped a watcher at a batch per commit.

The watermark counts the messages received (``{"received": n}``); it is not a position.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from localstate._core.backoff import Backoff
from localstate._core.failure_log import FailureLog
from localstate._core.swallowed_cancel import raise_swallowed_cancel
from localstate._sync.central.retention import REDELIVERED_KEY_PREFIX
from localstate.airflow.queues._message import QueueMessage
from localstate.airflow.queues._queue_trigger import QueueTrigger
from localstate.errors import CentralUnavailable, InvalidInput, WriteRejected, reason

__all__ = ["SETTLING_BATCHES", "SQS_BATCH", "SqsQueueTrigger"]

log = logging.getLogger("localstate.airflow.queues.sqs")

#: the most messages one ReceiveMessage returns
SQS_BATCH = 10
#: batches being committed centrally and deleted while the next ones are received
SETTLING_BATCHES = 4


class SqsQueueTrigger(QueueTrigger):
    """An Asset Watcher of an SQS queue: one asset event per message, effectively once (see
    the module docstring).

    `aws_conn_id`: the Airflow connection (the provider's ``aws_default``: login and password
    as the access key, ``region_name`` and ``endpoint_url`` in the extra); `region_name` and
    `endpoint_url` override it. `wait_seconds`: the long poll of ``ReceiveMessage``;
    `visibility_timeout`: how long a received message stays hidden (longer than a central
    commit takes). The event's payload holds ``queue_url``, ``message_id``, ``body``,
    ``attributes`` and ``message_attributes`` (a ``BinaryValue`` as ``{"base64": ...}``).
    """

    def __init__(self, *, queue_url: str, aws_conn_id: str | None = "aws_default",
                 region_name: str | None = None, endpoint_url: str | None = None,
                 route: str | None = None,
                 on_bad_message: str = "flag",
                 dead_letter: str | None = None, max_messages: int = 100, wait_seconds: int = 1,
                 visibility_timeout: int = 30) -> None:
        super().__init__(route=route, max_messages=max_messages,
                         on_bad_message=on_bad_message, dead_letter=dead_letter)
        if not queue_url:
            raise InvalidInput("queue_url must be the queue's URL")
        if not 0 <= wait_seconds <= 20:
            raise InvalidInput(f"wait_seconds must be 0 to 20 (SQS's limit), not {wait_seconds}")
        self.queue_url = queue_url
        self.aws_conn_id = aws_conn_id
        self.region_name = region_name
        self.endpoint_url = endpoint_url
        self.wait_seconds = wait_seconds
        self.visibility_timeout = visibility_timeout
        #: messages whose delete SQS refused (they come back, and are de-duplicated)
        self.delete_failures = 0
        #: one DeleteMessageBatch at a time (see `delete`)
        self._deleting = asyncio.Lock()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (self.classpath(), {
            "queue_url": self.queue_url, "aws_conn_id": self.aws_conn_id,
            "region_name": self.region_name, "endpoint_url": self.endpoint_url,
            "wait_seconds": self.wait_seconds, "visibility_timeout": self.visibility_timeout,
            **self.common_kwargs()})

    async def client_kwargs(self) -> dict[str, Any]:
        """aiobotocore's ``create_client`` arguments: the connection's, then this trigger's."""
        kwargs: dict[str, Any] = {}
        if self.aws_conn_id is not None:
            from airflow.sdk import BaseHook

            conn = await BaseHook.aget_connection(self.aws_conn_id)
            extra = conn.extra_dejson
            if conn.login:
                kwargs["aws_access_key_id"] = conn.login
                kwargs["aws_secret_access_key"] = conn.password
            for name in ("region_name", "endpoint_url", "aws_session_token"):
                if extra.get(name):
                    kwargs[name] = extra[name]
        if self.region_name is not None:
            kwargs["region_name"] = self.region_name
        if self.endpoint_url is not None:
            kwargs["endpoint_url"] = self.endpoint_url
        return kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from aiobotocore.session import get_session
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs = await self.client_kwargs()
        received = int((await self.get_watermark(default=None) or {}).get("received", 0))
        async with get_session().create_client("sqs", **kwargs) as client:
            backoff = Backoff(base=0.2, cap=10.0)
            reach = FailureLog(log, f"SQS {kwargs.get('endpoint_url', 'endpoint')} "
                                    f"(queue {self.queue_url})")
            settling: set[asyncio.Task[bool]] = set()
            first = True
            try:
                while True:
                    raise_swallowed_cancel()
                    await self.make_room(settling)
                    try:
                        batch = await self.receive(client)
                    except (BotoCoreError, ClientError) as exc:
                        # the endpoint out of reach, throttling, ...: nothing was taken
                        delay = backoff.next_delay()
                        reach.failed(f"cannot be reached: {exc}", retry_in=delay)
                        await asyncio.sleep(delay)
                        continue
                    reach.succeeded()
                    backoff.reset()
                    if not batch:
                        continue
                    received += len(batch)
                    settle = self.settle(client, batch, received)
                    if first:  # its emit claims the watched assets: once, before any other
                        first = not await settle  # until one batch is committed
                    else:
                        settling.add(asyncio.create_task(settle))
            finally:
                # cancelled (the trigger moved) or failed: what is not deleted comes back
                # after the visibility timeout, and its events are de-duplicated
                for task in settling:
                    task.cancel()
                await asyncio.gather(*settling, return_exceptions=True)
        yield TriggerEvent({})  # never reached: it makes run() the async generator Airflow runs

    async def make_room(self, settling: set[asyncio.Task[bool]]) -> None:
        """Drop the settled batches from `settling` (raising what failed one), waiting while
        `SETTLING_BATCHES` are under way."""
        while True:
            for task in [t for t in settling if t.done()]:
                settling.discard(task)
                task.result()  # an error no step expects is the trigger's
            if len(settling) < SETTLING_BATCHES:
                return
            await asyncio.wait(settling, return_when=asyncio.FIRST_COMPLETED)

    async def settle(self, client: Any, batch: list[dict[str, Any]], received: int) -> bool:
        """Emit `batch`'s events, wait until the central DB has committed them, then delete
        the messages (`received`: the messages received so far, the watermark). False: the
        central DB did not confirm the events in time (they are not deleted).

        Nor are they when the central DB kept its own watermark over this one (`WriteRejected`:
        another writer moved it on since this store read it, such as the triggerer this
        trigger moved from while this one's claim waited for the central DB, or an operator):
        whether their events went in or not, the messages come back and their events are
        de-duplicated, and the trigger goes on from the central record. (A triggerer whose
        claim was taken over gets `OwnerLost` instead: its run ends.)"""
        from botocore.exceptions import BotoCoreError, ClientError

        messages = [self._message(m) for m in batch]
        try:
            await self.emit_batch(messages, watermark={"received": received},
                                  durability="central")
        except (CentralUnavailable, WriteRejected) as exc:
            # not deleted: SQS shows them again after the visibility timeout, and the
            # events, committed or not, are de-duplicated by MessageId
            log.warning("%d SQS messages not confirmed by the central DB (%s); they are not "
                        "deleted and come back", len(batch), reason(exc))
            return False
        try:
            await self.delete(client, batch)
        except (BotoCoreError, ClientError) as exc:
            # committed, not deleted: they come back and are de-duplicated
            log.warning("could not delete %d SQS messages (%s); they come back and their "
                        "events are de-duplicated", len(batch), exc)
        return True

    async def receive(self, client: Any) -> list[dict[str, Any]]:
        """Up to `max_messages`: one long poll; when it came back full, the rest asked for at
        once, ten a call (calls side by side, not one after the other: a call's round trip,
        not its work, is most of its time)."""
        first = await self._receive(client, min(SQS_BATCH, self.max_messages),
                                    self.wait_seconds)
        left = self.max_messages - len(first)
        if len(first) < SQS_BATCH or left <= 0:  # the queue had no more just now
            return first
        sizes = [min(SQS_BATCH, left - start) for start in range(0, left, SQS_BATCH)]
        got = await asyncio.gather(*(self._receive(client, n, 0) for n in sizes),
                                   return_exceptions=True)
        out = list(first)
        for result in got:
            if isinstance(result, BaseException):
                # what the call took comes back after the visibility timeout
                log.warning("SQS queue %s: a receive failed (%s); its messages, if any, "
                            "come back after the visibility timeout", self.queue_url, result)
            else:
                out.extend(result)
        return out

    async def _receive(self, client: Any, count: int, wait: int) -> list[dict[str, Any]]:
        response = await client.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=count, WaitTimeSeconds=wait,
            VisibilityTimeout=self.visibility_timeout, MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"])
        messages: list[dict[str, Any]] = response.get("Messages", [])
        return messages

    async def delete(self, client: Any, batch: list[dict[str, Any]]) -> None:
        """Delete `batch` (its events are committed), ten a call; log what SQS refused.

        One call at a time, whichever batch it is for: moto's SQS server (the tests' endpoint)
        rebuilds a queue's message list on each delete without a lock, so two deletes side by
        side can each undo the other's (the message comes back after its visibility timeout,
        its event de-duplicated, but it lingers in the queue)."""
        async with self._deleting:
            for start in range(0, len(batch), SQS_BATCH):
                await self._delete(client, batch[start:start + SQS_BATCH])

    async def _delete(self, client: Any, chunk: list[dict[str, Any]]) -> None:
        response = await client.delete_message_batch(
            QueueUrl=self.queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                     for i, m in enumerate(chunk)])
        failed = response.get("Failed", [])
        if failed:
            self.delete_failures += len(failed)
            log.warning("SQS refused to delete %d of %d messages (%s); they come back after "
                        "the visibility timeout and their events are de-duplicated",
                        len(failed), len(chunk),
                        "; ".join(f"{f.get('Code')}: {f.get('Message')}" for f in failed))

    def _message(self, m: dict[str, Any]) -> QueueMessage:
        message_id = str(m["MessageId"])
        payload = {
            "queue_url": self.queue_url, "message_id": message_id, "body": m.get("Body"),
            "attributes": m.get("Attributes", {}),
            "message_attributes": {
                name: {k: {"base64": base64.b64encode(v).decode("ascii")}
                       if isinstance(v, bytes) else v for k, v in attribute.items()}
                for name, attribute in m.get("MessageAttributes", {}).items()}}
        return QueueMessage("sqs", self.queue_url, f"{REDELIVERED_KEY_PREFIX}{message_id}",
                            payload, content=("body", "message_attributes"))
