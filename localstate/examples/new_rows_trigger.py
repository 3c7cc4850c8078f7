"""`NewRowsTrigger`: an Asset Watcher that polls a SQL table for rows with a larger id.

A high-frequency poll (every `poll_interval` seconds, 50 ms by default) of
``SELECT id FROM <table> WHERE id > <watermark> ORDER BY id LIMIT <batch_size>``, one
`TriggerEvent` per batch of new rows, and a watermark kept with localstate: each advance is a
dict update plus a local commit; Airflow's ``asset_state_store`` (or the central table) gets
the coalesced value about once per ``flush_interval``.

At least once, never a skipped row: an event the trigger yields sits in the triggerer's memory
until its next round ships it to the supervisor (about a second), and a crash before then loses
it. So the watermark only moves past a batch `ack_delay` seconds (5 by default) after its event
was yielded; after a crash the rows of the last `ack_delay` seconds (plus the flush interval,
when the local cache is lost with the machine) are emitted again. Consumers key on row ids.

The table is read with a plain driver: asyncpg for ``postgresql://`` DSNs, the standard
library's sqlite3 (on a worker thread) for ``sqlite:///path``.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger

__all__ = ["NewRowsTrigger"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")

Fetch = Callable[[int], Awaitable[list[int]]]


class NewRowsTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Fires one event per batch of rows of `table` whose `id_column` exceeds the watermark."""

    def __init__(self, *, dsn: str, table: str, id_column: str = "id",
                 batch_size: int = 100, poll_interval: float = 0.05,
                 ack_delay: float = 5.0) -> None:
        super().__init__()
        for what, name in (("table", table), ("id_column", id_column)):
            if not _IDENTIFIER.fullmatch(name):
                raise ValueError(f"{what} {name!r} is not a plain SQL identifier")
        if not dsn.startswith(("postgresql://", "sqlite:///")):
            raise ValueError(f"dsn {dsn!r}: expected postgresql://... or sqlite:///path")
        self.dsn = dsn
        self.table = table
        self.id_column = id_column
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.ack_delay = ack_delay

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "dsn": self.dsn, "table": self.table, "id_column": self.id_column,
            "batch_size": self.batch_size, "poll_interval": self.poll_interval,
            "ack_delay": self.ack_delay,
        })

    def _query(self, placeholder: str) -> str:
        return (f"SELECT {self.id_column} FROM {self.table} WHERE {self.id_column} > "
                f"{placeholder} ORDER BY {self.id_column} LIMIT {int(self.batch_size)}")

    async def run(self) -> AsyncIterator[TriggerEvent]:
        acked = int(await self.get_watermark(default=0))
        #: (time yielded, last id of the batch): moved into the watermark after ack_delay
        pending: deque[tuple[float, int]] = deque()
        last = acked
        async with _Table(self.dsn, self._query) as fetch:
            while True:
                ids = await fetch(last)
                if ids:
                    yield TriggerEvent({"table": self.table, "after": last, "first": ids[0],
                                        "last": ids[-1], "count": len(ids)})
                    last = ids[-1]
                    pending.append((time.monotonic(), last))
                settled = acked
                while pending and time.monotonic() - pending[0][0] >= self.ack_delay:
                    settled = pending.popleft()[1]
                if settled > acked:
                    acked = settled
                    await self.set_watermark(acked)
                if not ids or len(ids) < self.batch_size:
                    await asyncio.sleep(self.poll_interval)


class _Table:
    """The polled table through a plain driver: asyncpg, or sqlite3 on a worker thread."""

    def __init__(self, dsn: str, query: Callable[[str], str]) -> None:
        self._dsn = dsn
        self._query = query
        self._close: Callable[[], Awaitable[None]] | None = None

    async def __aenter__(self) -> Fetch:
        if self._dsn.startswith("postgresql://"):
            import asyncpg

            pg = await asyncpg.connect(self._dsn)
            self._close = pg.close
            sql = self._query("$1")

            async def fetch_pg(after: int) -> list[int]:
                return [int(r[0]) for r in await pg.fetch(sql, after)]

            return fetch_pg
        path = self._dsn.removeprefix("sqlite:///")
        lite = await asyncio.to_thread(sqlite3.connect, path, check_same_thread=False)
        sql = self._query("?")

        async def close_lite() -> None:
            await asyncio.to_thread(lite.close)

        self._close = close_lite

        def read(after: int) -> list[int]:
            return [int(r[0]) for r in lite.execute(sql, (after,)).fetchall()]

        async def fetch_lite(after: int) -> list[int]:
            return await asyncio.to_thread(read, after)

        return fetch_lite

    async def __aexit__(self, *exc: object) -> None:
        if self._close is not None:
            await self._close()
