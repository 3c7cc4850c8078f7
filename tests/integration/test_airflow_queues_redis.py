"""`RedisStreamTrigger` against a real ``redis-server`` and a real central DB: one event per
entry keyed ``stream/id``, in stream order, a read's batch in one local commit, resumed on
another triggerer from the watermark, through a Redis restart (its append-only file), and a
stream trimmed past the watermark as `SourcePositionLost`."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import StoreFactory
from queue_watchers import running, wait_for_keys

from localstate._testing.queue_broker import QueueBroker, redis_server
from localstate.airflow.queues import RedisStreamTrigger
from localstate.airflow.queues._redis import check_not_trimmed
from localstate.errors import InvalidInput, SourcePositionLost

pytestmark = pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueBroker]:
    with redis_server(tmp_path_factory.mktemp("redis")) as b:
        yield b


def add(broker: QueueBroker, stream: str, numbers: range) -> list[str]:
    """Entries ``n=<n>``; their ids, in order."""
    client = redis.Redis(host="127.0.0.1", port=broker.port)
    with client.pipeline(transaction=False) as pipe:
        for n in numbers:
            pipe.xadd(stream, {"n": str(n)})
        ids = [i.decode() for i in pipe.execute()]
    client.close()
    return ids


def watcher(broker: QueueBroker, stream: str, **kwargs: object) -> RedisStreamTrigger:
    return RedisStreamTrigger(stream=stream, url=f"redis://{broker.address}/0", block_ms=100,
                              **kwargs)  # type: ignore[arg-type]


async def test_each_entry_is_one_event_in_order_and_a_read_is_one_commit(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    ids = add(broker, stream, range(1, 501))
    store = await open_store(flush_interval=0.2)
    trigger = watcher(broker, stream, max_messages=100)
    owner = trigger.state_owner
    assert store.local_cache is not None
    async with running(trigger, store) as task:
        keys = await wait_for_keys(central_url, owner, 500, store, task)
        commits = store.local_cache.commits
    assert keys == [f"{stream}/{i}" for i in ids]
    assert commits < 500 / 10, commits
    assert await store.get(owner, "watermark") == {"id": ids[-1], "read": 500}


async def test_resumes_on_another_triggerer_across_a_redis_restart(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    ids = add(broker, stream, range(1, 201))
    first = await open_store(triggerer_id="first", flush_interval=0.2)
    trigger = watcher(broker, stream, max_messages=30)
    owner = trigger.state_owner
    async with running(trigger, first) as task:
        await wait_for_keys(central_url, owner, 200, first, task)
    await first.close()
    broker.restart()  # SIGKILL: the append-only file keeps the stream
    ids += add(broker, stream, range(201, 301))
    second = await open_store(triggerer_id="second", flush_interval=0.2)
    moved = watcher(broker, stream, max_messages=30)
    async with running(moved, second) as task:
        keys = await wait_for_keys(central_url, owner, 300, second, task)
    assert keys == [f"{stream}/{i}" for i in ids]


async def test_a_stream_trimmed_past_the_watermark_stops_the_watcher(
        broker: QueueBroker, open_store: StoreFactory, central_url: str) -> None:
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    add(broker, stream, range(1, 51))
    store = await open_store(flush_interval=0.2)
    trigger = watcher(broker, stream)
    owner = trigger.state_owner
    async with running(trigger, store) as task:
        await wait_for_keys(central_url, owner, 50, store, task)
    # trimming what was read loses nothing: the watcher goes on
    client = redis.Redis(host="127.0.0.1", port=broker.port)
    client.xtrim(stream, maxlen=10, approximate=False)
    ids = add(broker, stream, range(51, 61))
    async with running(watcher(broker, stream), store) as task:
        keys = await wait_for_keys(central_url, owner, 60, store, task)
    assert keys[-10:] == [f"{stream}/{i}" for i in ids]
    # entries added and trimmed before the watcher read them: 20 lost
    add(broker, stream, range(61, 91))
    client.xtrim(stream, maxlen=10, approximate=False)
    client.close()
    with pytest.raises(SourcePositionLost, match="20 entries it had not read") as e:
        async with running(watcher(broker, stream), store) as task:
            await task
    assert e.value.source == stream
    assert e.value.position == ids[-1]


async def test_a_cancel_redis_py_drops_still_ends_the_watcher(
        broker: QueueBroker, open_store: StoreFactory, central_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-py writes each command through `asyncio.wait_for` (its socket timeout), and
    Python 3.11's `wait_for` drops a cancel that lands as the write completes. The write of
    the watcher's XREAD is made to cancel the watcher at that moment: it must end anyway."""
    from redis.asyncio.connection import Connection

    stream = f"orders-{uuid.uuid4().hex[:8]}"
    add(broker, stream, range(1, 11))
    store = await open_store(flush_interval=0.2)
    trigger = watcher(broker, stream)
    target: list[asyncio.Task[None]] = []  # armed: the watcher's task
    fired: list[bytes] = []
    send = Connection._send_packed_command

    async def send_then_cancel(self: Connection, command: Any) -> None:
        await send(self, command)
        packed = b"".join(bytes(c) for c in command)
        if target and b"XREAD" in packed:
            fired.append(packed)
            target.pop().cancel()  # the write is done; wait_for has not seen it yet

    monkeypatch.setattr(Connection, "_send_packed_command", send_then_cancel)
    async with running(trigger, store) as task:
        await wait_for_keys(central_url, trigger.state_owner, 10, store, task)
        target.append(task)
        done, _ = await asyncio.wait({task}, timeout=30)  # a bound against a hang, no more
        assert fired, "the watcher sent no XREAD after it was armed"
        assert task in done, "the watcher went on polling after its cancel"
        assert task.cancelled()


def test_a_stream_gone_after_entries_were_read_is_a_typed_error(backend: str) -> None:
    with pytest.raises(SourcePositionLost, match="is gone"):
        check_not_trimmed("s", None, "5-0", 3)
    check_not_trimmed("s", None, "0-0", 0)  # not created yet: the watcher waits
    check_not_trimmed("s", {"entries-added": 10, "length": 4}, "9-0", 6)
    with pytest.raises(InvalidInput, match="start"):
        RedisStreamTrigger(stream="s", start="now")


@pytest.mark.parametrize("start", ["earliest", "latest"])
async def test_a_redis_down_when_the_trigger_starts_is_waited_for(
        open_store: StoreFactory, central_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, start: str) -> None:
    """Nothing listens at the URL when the trigger starts (``latest`` must read the stream's
    end first): it waits, logging what it cannot reach, and reads the stream once Redis is
    up."""
    down = redis_server(tmp_path)  # not started
    store = await open_store(flush_interval=0.2)
    trigger = RedisStreamTrigger(stream="late", url=f"redis://{down.address}/0", block_ms=100,
                                 start=start)
    caplog.set_level(logging.INFO, "localstate.airflow.queues.redis")
    async with running(trigger, store) as task:
        for _ in range(600):
            assert not task.done(), task.exception() if task.done() else None
            if any(down.address in r.getMessage() and "cannot be reached" in r.getMessage()
                   for r in caplog.records):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("no log line says Redis cannot be reached")
        with down:
            # back: the trigger has read its start (for latest, the stream's end) from Redis
            for _ in range(600):
                assert not task.done(), task.exception() if task.done() else None
                if any("recovered after" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("no log line says Redis is back")
            ids = add(down, "late", range(1, 21))
            keys = await wait_for_keys(central_url, trigger.state_owner, 20, store, task)
    assert keys == [f"late/{i}" for i in ids]
