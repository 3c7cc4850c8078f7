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

Where the triggerer flushes through localstate's API (``sink = api``) or to Airflow's database
(``sink = sql``), `NewRowsEventsTrigger` delivers one event per row exactly once instead.

The table is read with a plain driver (`PolledTable`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger
from localstate.examples.polled_table import PolledTable, check_source

__all__ = ["NewRowsTrigger"]


class NewRowsTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Fires one event per batch of rows of `table` whose `id_column` exceeds the watermark."""

    def __init__(self, *, dsn: str, table: str, id_column: str = "id",
                 batch_size: int = 100, poll_interval: float = 0.05,
                 ack_delay: float = 5.0) -> None:
        super().__init__()
        check_source(dsn, table, id_column)
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

    async def run(self) -> AsyncIterator[TriggerEvent]:
        acked = int(await self.get_watermark(default=0))
        #: (time yielded, last id of the batch): moved into the watermark after ack_delay
        pending: deque[tuple[float, int]] = deque()
        last = acked
        async with PolledTable(self.dsn, self.table, self.id_column, self.batch_size) as fetch:
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
