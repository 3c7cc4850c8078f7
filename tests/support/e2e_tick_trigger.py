"""`TickTrigger`: an asset watcher whose watermark is the wall-clock time of each set.

Used by tests/airflow/test_airflow_api_e2e.py in a real ``airflow triggerer``. Every `period`
seconds the trigger sets its watermark (the `StateEnabledTrigger` mixin) to ``time.time()``: values
only grow, so ``max`` keeps them, and a central row's value tells when it was set (the flush
lag is the central commit time minus that). When it starts it records the watermark it
resumed from under the key ``resumed_from``. The trigger with index 0 also writes, into the
folder ``$LOCALSTATE_E2E_PROBE``, what the trigger runner process itself sees: its pid, its
``sql_alchemy_conn`` and the store's sink and central URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger, trigger_store


class TickTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Sets its watermark to the current time every `period` seconds; never fires."""

    def __init__(self, *, index: int, period: float) -> None:
        super().__init__()
        self.index = index
        self.period = period

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"index": self.index, "period": self.period})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        start = float(await self.get_watermark(default=0.0))
        await self.state_variable("resumed_from").set(start)
        if self.index == 0:
            await _probe()
        while True:
            await self.set_watermark(time.time())
            await asyncio.sleep(self.period)
        yield TriggerEvent({})  # pragma: no cover - makes run() an async generator


async def _probe() -> None:
    folder = os.environ.get("LOCALSTATE_E2E_PROBE")
    if not folder:
        return
    store = await trigger_store()
    seen = {
        "pid": os.getpid(),
        "sql_alchemy_conn": os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"),
        "central_url": store.settings.central_url,
        "sink": store.settings.sink,
        "has_central_store": store.central_store is not None,
    }
    path = Path(folder) / f"runner-{os.getpid()}.json"
    path.write_text(json.dumps(seen))
