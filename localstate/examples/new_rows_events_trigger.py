"""`NewRowsEventsTrigger`: an Asset Watcher that delivers one asset event per new row of a SQL
table, exactly once.

It polls ``<table>`` for rows whose ``<id_column>`` exceeds its watermark (`PolledTable`) and
emits each row with the watermark it advances to: ``await self.emit({...}, watermark=id)``.
The event and the watermark are one local commit and then one transaction of Airflow's
database, which keeps one event per row id: a crash, a restart or a takeover by another
triggerer neither loses a row's event nor repeats it, and consumers need no de-duplication.

It needs ``[localstate] sink = api`` (or ``sql`` on Airflow's database) and the local cache
on; under ``sink = airflow`` `emit` raises `EventsUnsupported` (use `NewRowsTrigger` there).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger
from localstate.examples.polled_table import PolledTable, check_source

__all__ = ["NewRowsEventsTrigger"]


class NewRowsEventsTrigger(StateEnabledTrigger, BaseEventTrigger):
    """One asset event per row of `table` whose `id_column` exceeds the watermark."""

    def __init__(self, *, dsn: str, table: str, id_column: str = "id",
                 batch_size: int = 100, poll_interval: float = 0.05) -> None:
        super().__init__()
        check_source(dsn, table, id_column)
        self.dsn = dsn
        self.table = table
        self.id_column = id_column
        self.batch_size = batch_size
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "dsn": self.dsn, "table": self.table, "id_column": self.id_column,
            "batch_size": self.batch_size, "poll_interval": self.poll_interval,
        })

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last = int(await self.get_watermark(default=0))
        async with PolledTable(self.dsn, self.table, self.id_column, self.batch_size) as fetch:
            while True:
                ids = await fetch(last)
                for row_id in ids:
                    # the event and the watermark past this row: one commit, exactly once
                    await self.emit({"table": self.table, "id": row_id}, watermark=row_id)
                    last = row_id
                if len(ids) < self.batch_size:
                    await asyncio.sleep(self.poll_interval)
        yield TriggerEvent({})  # never reached: it makes run() the async generator Airflow runs
