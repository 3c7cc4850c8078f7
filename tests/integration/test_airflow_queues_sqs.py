"""`SqsQueueTrigger` against a real SQS endpoint (moto's server) and a real central DB: one
event per message keyed ``sqs/<MessageId>``, each deleted only once the central DB holds its
event, a redelivered message de-duplicated, a refused delete counted and logged, and the
next batches received while earlier ones are committed and deleted (at most
`SETTLING_BATCHES` at once)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiobotocore.session import get_session
from conftest import StoreFactory
from queue_watchers import committed_keys, running, wait_for_keys

from localstate import StateStore, StateVariable
from localstate._sync.central.central_store import CentralStore
from localstate._testing.queue_broker import QueueBroker, moto_server
from localstate.airflow.queues import SqsQueueTrigger
from localstate.airflow.queues._sqs import SETTLING_BATCHES
from localstate.errors import InvalidInput

pytestmark = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)

AWS = {"region_name": "us-east-1", "aws_access_key_id": "testing",
       "aws_secret_access_key": "testing"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueBroker]:
    with moto_server(tmp_path_factory.mktemp("moto")) as b:
        yield b


@pytest.fixture(autouse=True)
def _aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@pytest_asyncio.fixture
async def sqs(broker: QueueBroker) -> AsyncIterator[Any]:
    async with get_session().create_client(
            "sqs", endpoint_url=f"http://{broker.address}", **AWS) as client:
        yield client


async def new_queue(sqs: Any, messages: int) -> tuple[str, list[str]]:
    """A queue with `messages` numbered messages; its URL and their MessageIds."""
    url = (await sqs.create_queue(QueueName=f"orders-{uuid.uuid4().hex[:8]}"))["QueueUrl"]
    ids: list[str] = []
    for start in range(1, messages + 1, 10):
        response = await sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(n), "MessageBody": f'{{"n": {n}}}'}
            for n in range(start, min(start + 10, messages + 1))])
        ids += [r["MessageId"] for r in response["Successful"]]
    return url, ids


async def left_in(sqs: Any, url: str) -> int:
    attrs = (await sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                      "ApproximateNumberOfMessagesNotVisible"]))["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]) + int(
        attrs["ApproximateNumberOfMessagesNotVisible"])


async def drained(sqs: Any, url: str, central_url: str, owner: str, count: int,
                  store: StateStore, task: asyncio.Task[None]) -> list[str]:
    """The keys of `owner`'s committed events once there are `count`, after flushing until
    the queue is empty (each delete waits for its batch's central commit; at most 100
    flushes): the running trigger's work done."""
    keys = await wait_for_keys(central_url, owner, count, store, task)
    for _ in range(100):
        if not await left_in(sqs, url):
            break
        await store.flush()
    return keys


def watcher(broker: QueueBroker, url: str, **kwargs: Any) -> SqsQueueTrigger:
    return SqsQueueTrigger(queue_url=url, aws_conn_id=None, region_name="us-east-1",
                           endpoint_url=f"http://{broker.address}", wait_seconds=0,
                           **kwargs)


async def test_each_message_is_one_event_then_deleted(
        broker: QueueBroker, sqs: Any, open_store: StoreFactory, central_url: str) -> None:
    url, ids = await new_queue(sqs, 120)
    store = await open_store(flush_interval=0.2)
    trigger = watcher(broker, url, max_messages=50)
    owner = trigger.state_owner
    assert store.local_cache is not None
    async with running(trigger, store) as task:
        keys = await drained(sqs, url, central_url, owner, 120, store, task)
    assert sorted(keys) == sorted(f"sqs/{i}" for i in ids)
    assert await left_in(sqs, url) == 0  # every message deleted, after its event committed
    assert trigger.delete_failures == 0


async def test_a_message_delivered_again_has_one_event(
        broker: QueueBroker, sqs: Any, open_store: StoreFactory, central_url: str) -> None:
    """A triggerer that died after the central commit but before the delete: SQS delivers
    the messages again and their events are de-duplicated by MessageId."""
    url, ids = await new_queue(sqs, 10)
    store = await open_store(flush_interval=0.2)
    trigger = watcher(broker, url)
    owner = trigger.state_owner
    first = await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                      VisibilityTimeout=0)
    async with running(trigger, store) as task:
        await trigger.open_state()
        # the died-after-commit run: committed centrally, never deleted
        await trigger.emit_batch([trigger._message(m) for m in first["Messages"]],
                                 watermark={"received": 10}, durability="central")
        keys = await drained(sqs, url, central_url, owner, 10, store, task)
    assert sorted(keys) == sorted(f"sqs/{i}" for i in ids)
    assert len(await committed_keys(central_url, owner)) == 10
    assert await left_in(sqs, url) == 0
    figures = store.event_figures()[owner]
    assert figures.duplicates >= 1  # the redelivered ones, dropped centrally


async def test_a_batch_whose_watermark_the_central_db_refused_comes_back(
        broker: QueueBroker, sqs: Any, open_store: StoreFactory, central_url: str) -> None:
    """Another writer moved the watermark on centrally since this store read it (the
    triggerer this trigger moved from, while this one's claim waited for the central DB; an
    operator): the central DB keeps its record over the batch's (`WriteRejected`). Its
    messages are not deleted and the trigger goes on: they come back, each event once."""
    url, ids = await new_queue(sqs, 10)
    store = await open_store(flush_interval=0.2)
    trigger = watcher(broker, url)
    owner = trigger.state_owner
    StateVariable.configure(store)
    try:
        await trigger.set_watermark({"received": 0})
        await store.flush()
        async with CentralStore.open(central_url) as central:  # unfenced, as an operator's
            await central.write_if_version(owner, "watermark", '{"received":99}', 1,
                                           updated_by="operator")
        got = (await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                         VisibilityTimeout=0))["Messages"]
        assert got
        assert await trigger.settle(sqs, got, len(got)) is False
        assert await left_in(sqs, url) == 10  # none deleted
    finally:
        StateVariable.configure(None)
    async with running(trigger, store) as task:
        keys = await drained(sqs, url, central_url, owner, 10, store, task)
    assert sorted(keys) == sorted(f"sqs/{i}" for i in ids)  # each once
    assert await left_in(sqs, url) == 0


async def test_a_refused_delete_is_counted_and_the_rest_deleted(
        broker: QueueBroker, sqs: Any, backend: str) -> None:
    url, _ids = await new_queue(sqs, 3)
    got = (await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10))["Messages"]
    trigger = watcher(broker, url)
    bogus = {"ReceiptHandle": "not-a-receipt-handle", "MessageId": "x"}
    await trigger.delete(sqs, [*got, bogus])
    assert trigger.delete_failures == 1
    assert await left_in(sqs, url) == 0


def test_bad_arguments_are_refused(backend: str) -> None:
    with pytest.raises(InvalidInput, match="queue_url"):
        SqsQueueTrigger(queue_url="")
    with pytest.raises(InvalidInput, match="wait_seconds"):
        SqsQueueTrigger(queue_url="u", wait_seconds=21)
    classpath, kwargs = SqsQueueTrigger(queue_url="u").serialize()
    assert classpath == "localstate.airflow.queues.SqsQueueTrigger"
    assert SqsQueueTrigger(**kwargs).serialize() == (classpath, kwargs)


class _HeldSettle(SqsQueueTrigger):
    """Its batches after the first are committed and deleted only once `release` is set."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = asyncio.Event()
        self.batches = 0
        self.received = 0

    async def settle(self, client: Any, batch: list[dict[str, Any]], received: int) -> bool:
        self.batches += 1
        self.received = received
        if self.batches > 1:
            await self.release.wait()
        return await super().settle(client, batch, received)


async def test_batches_are_received_while_earlier_ones_settle(
        broker: QueueBroker, sqs: Any, open_store: StoreFactory, central_url: str) -> None:
    """The receive loop does not wait for a batch's central commit and delete: with those
    held, it goes on receiving, up to `SETTLING_BATCHES` batches under way; released, every
    message has its one event and is deleted."""
    batches = SETTLING_BATCHES + 3
    url, ids = await new_queue(sqs, 10 * batches)
    store = await open_store(flush_interval=0.2)
    trigger = _HeldSettle(queue_url=url, aws_conn_id=None, region_name="us-east-1",
                          endpoint_url=f"http://{broker.address}", wait_seconds=0,
                          max_messages=10, visibility_timeout=60)
    owner = trigger.state_owner
    async with running(trigger, store) as task:
        for _ in range(600):
            if trigger.batches > SETTLING_BATCHES:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # room for a receive too many, had the bound not held
        # the first batch settled alone, then SETTLING_BATCHES held ones: received meanwhile
        assert trigger.batches == 1 + SETTLING_BATCHES
        assert trigger.received == 10 * (1 + SETTLING_BATCHES)
        assert await left_in(sqs, url) == 10 * (batches - 1)  # only the first one deleted
        trigger.release.set()
        keys = await drained(sqs, url, central_url, owner, 10 * batches, store, task)
    assert sorted(keys) == sorted(f"sqs/{i}" for i in ids)
    assert await left_in(sqs, url) == 0


async def test_an_endpoint_down_when_the_trigger_starts_is_waited_for(
        open_store: StoreFactory, central_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens at the endpoint when the trigger starts: it waits, logging what it
    cannot reach, and takes the queue's messages once the endpoint is up."""
    down = moto_server(tmp_path)  # not started
    url = f"http://{down.address}/123456789012/late"
    store = await open_store(flush_interval=0.2)
    trigger = watcher(down, url)
    caplog.set_level(logging.INFO, "localstate.airflow.queues.sqs")
    async with running(trigger, store) as task:
        for _ in range(600):
            assert not task.done(), task.exception() if task.done() else None
            if any(down.address in r.getMessage() and "cannot be reached" in r.getMessage()
                   for r in caplog.records):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no log line says the endpoint cannot be reached")
        with down:
            async with get_session().create_client(
                    "sqs", endpoint_url=f"http://{down.address}", **AWS) as sqs:
                assert (await sqs.create_queue(QueueName="late"))["QueueUrl"] == url
                await sqs.send_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(n), "MessageBody": str(n)} for n in range(10)])
                keys = await drained(sqs, url, central_url, trigger.state_owner, 10, store,
                                     task)
    assert len(keys) == len(set(keys)) == 10
    assert any("recovered after" in r.getMessage() for r in caplog.records)
