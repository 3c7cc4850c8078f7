"""`RedisStreamTrigger`: one asset event per entry of a Redis stream, exactly once.

The watermark is the last entry id read and how many entries the stream had had before the
next one (``{"id": "1718-3", "read": 1042}``). Each step reads, in one ``MULTI``, the stream's
``XINFO STREAM`` and the entries after the id (``XRANGE (id + COUNT n``), emits them with the
watermark past them as one commit (`emit_batch`), and when there is nothing new waits with
``XREAD BLOCK`` from the id. The event key is ``stream/id``.

A stream trimmed past the watermark (``XTRIM``, ``MAXLEN`` on ``XADD``, ``XDEL`` of entries not
yet read, a Redis restarted without its data) is `SourcePositionLost`: the stream has removed
more entries (``entries-added`` minus its length) than the watcher had read, so some were never
read. Redis 7 or later (``entries-added``).

A Redis that cannot be reached, when the trigger starts or later, is waited for with backoff:
one WARNING says what is out of reach, a summary every minute how long for, and an INFO when
it is back (`FailureLog`, as for the central DB).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from localstate._core.backoff import Backoff
from localstate._core.failure_log import FailureLog
from localstate._core.swallowed_cancel import raise_swallowed_cancel
from localstate.airflow.queues._message import QueueMessage, field_name, field_value
from localstate.airflow.queues._queue_trigger import QueueTrigger
from localstate.errors import InvalidInput, SourcePositionLost

__all__ = ["RedisStreamTrigger", "check_not_trimmed"]

log = logging.getLogger("localstate.airflow.queues.redis")

START_ID = "0-0"


def check_not_trimmed(stream: str, info: dict[str, Any] | None, last_id: str, read: int) -> None:
    """`SourcePositionLost` when the stream (its ``XINFO STREAM`` `info`, None: no such key)
    removed entries the watcher, at `last_id` after `read` entries, never read."""
    if info is None:
        if read:
            raise SourcePositionLost(
                f"the Redis stream {stream!r} is gone (deleted, or Redis restarted without its "
                f"data) while this watcher had read {read} of its entries, up to {last_id}: "
                "any entries added after that are lost. See the troubleshooting entry "
                "SourcePositionLost.", source=stream, position=last_id)
        return
    removed = int(info["entries-added"]) - int(info["length"])
    if removed > read:
        first = info.get("recorded-first-entry-id")
        earliest = first.decode() if isinstance(first, bytes) else first
        raise SourcePositionLost(
            f"the Redis stream {stream!r} was trimmed past this watcher's position {last_id}: "
            f"{removed - read} entries it had not read were removed (XTRIM, MAXLEN or XDEL); "
            f"the oldest entry kept is {earliest}. See the troubleshooting entry "
            "SourcePositionLost.", source=stream, position=last_id, earliest=earliest)


class RedisStreamTrigger(QueueTrigger):
    """An Asset Watcher of a Redis stream: one asset event per entry, exactly once.

    `redis_conn_id`: the Airflow connection (the provider's ``redis_default``: host, port,
    password, ``db`` in the extra); or `url` (``redis://host:port/db``). `start`:
    ``earliest`` (every entry the stream holds) or ``latest`` (entries added after the
    trigger first ran). The event's payload holds ``stream``, ``id`` and ``fields`` (each value
    the text when UTF-8, else ``{"base64": ...}``; a name that is not UTF-8 is ``base64:`` and
    its base64).
    """

    def __init__(self, *, stream: str, redis_conn_id: str = "redis_default",
                 url: str | None = None, start: str = "earliest", route: str | None = None,
                 on_bad_message: str = "flag",
                 dead_letter: str | None = None,
                 max_messages: int = 500, block_ms: int = 1000) -> None:
        super().__init__(route=route, max_messages=max_messages,
                         on_bad_message=on_bad_message, dead_letter=dead_letter)
        if not stream:
            raise InvalidInput("stream must be a non-empty key name")
        if start not in ("earliest", "latest"):
            raise InvalidInput(f"start must be 'earliest' or 'latest', not {start!r}")
        self.stream = stream
        self.redis_conn_id = redis_conn_id
        self.url = url
        self.start = start
        self.block_ms = block_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (self.classpath(), {
            "stream": self.stream, "redis_conn_id": self.redis_conn_id, "url": self.url,
            "start": self.start, "block_ms": self.block_ms, **self.common_kwargs()})

    async def client(self) -> Any:
        """A redis-py asyncio client, from `url` or the Airflow connection."""
        import redis.asyncio as redis

        if self.url is not None:
            return redis.Redis.from_url(self.url)
        from airflow.sdk import BaseHook

        conn = await BaseHook.aget_connection(self.redis_conn_id)
        extra = conn.extra_dejson
        return redis.Redis(host=conn.host or "localhost", port=conn.port or 6379,
                           username=conn.login or None, password=conn.password or None,
                           db=int(extra.get("db", 0)), ssl=bool(extra.get("ssl", False)))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import redis

        client = await self.client()
        where = self.url if self.url is not None else f"connection {self.redis_conn_id}"
        reach = FailureLog(log, f"Redis {where} (stream {self.stream})")
        try:
            stored = await self.get_watermark(default=None)
            position = None if stored is None else (str(stored["id"]), int(stored["read"]))
            backoff = Backoff(base=0.2, cap=10.0)
            while True:
                raise_swallowed_cancel()  # redis-py's command writes can drop a cancel
                try:
                    if position is None:  # ``latest`` reads the stream's end: Redis is needed
                        start = await self._start_position(client)
                        position = (str(start["id"]), int(start["read"]))
                    last_id, read = position
                    info, entries = await self._snapshot(client, last_id)
                    reach.succeeded()
                    backoff.reset()
                    check_not_trimmed(self.stream, info, last_id, read)
                    if not entries:
                        await client.xread({self.stream: last_id}, count=1,
                                           block=self.block_ms)
                        continue
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    # Redis restarting, or out of reach: the position is ours, try again
                    delay = backoff.next_delay()
                    reach.failed(f"cannot be reached: {exc}", retry_in=delay)
                    await asyncio.sleep(delay)
                    continue
                messages = [self._message(entry_id, fields) for entry_id, fields in entries]
                last_id = messages[-1].payload["id"]
                read += len(messages)
                position = (last_id, read)
                await self.emit_batch(messages, watermark={"id": last_id, "read": read})
        finally:
            await client.aclose()
        yield TriggerEvent({})  # never reached: it makes run() the async generator Airflow runs

    async def _start_position(self, client: Any) -> dict[str, Any]:
        """The watermark before the first entry: the stream's start, or (``latest``) its end,
        written at once, so that a restart does not move it."""
        if self.start == "earliest":
            return {"id": START_ID, "read": 0}
        info, _ = await self._snapshot(client, START_ID, count=0)
        if info is None:
            position = {"id": START_ID, "read": 0}
        else:
            last = info["last-generated-id"]
            position = {"id": last.decode() if isinstance(last, bytes) else str(last),
                        "read": int(info["entries-added"])}
        await self.set_watermark(position)
        return position

    async def _snapshot(self, client: Any, last_id: str, count: int | None = None
                        ) -> tuple[dict[str, Any] | None, list[tuple[Any, Any]]]:
        """The stream's ``XINFO STREAM`` (None: no such key) and its entries after `last_id`,
        read in one transaction."""
        import redis

        n = self.max_messages if count is None else count
        async with client.pipeline(transaction=True) as pipe:
            pipe.xinfo_stream(self.stream)
            pipe.xrange(self.stream, min=f"({last_id}", count=max(n, 1))
            info, entries = await pipe.execute(raise_on_error=False)
        if isinstance(info, redis.ResponseError):
            if "no such key" not in str(info).lower():
                raise info
            return None, []
        if isinstance(entries, Exception):
            raise entries
        return info, entries if n else []

    def _message(self, entry_id: Any, fields: dict[Any, Any]) -> QueueMessage:
        text_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        payload: dict[str, Any] = {
            "stream": self.stream, "id": text_id,
            "fields": {field_name(name): field_value(value) for name, value in fields.items()}}
        return QueueMessage("redis", self.stream, f"{self.stream}/{text_id}", payload,
                            content=("fields",))
