"""Watcher triggers over a numbered source, for tests/support/events_chaos.py in real triggerers.

The source of watcher `index` is the folder ``$LOCALSTATE_E2E_SOURCE/<index>``: the scenario
writes the empty files ``00000001``, ``00000002``, ... into it at a steady rate. Each trigger
polls its folder and produces one asset event per new file, in number order:

* `EmitSourceTrigger` (localstate): ``await self.emit({"n": n}, watermark=n)``; the event and
  the watermark commit together, exactly once;
* `PlainSourceTrigger` (Airflow's own API only): yields ``TriggerEvent({"n": n})``, then keeps
  the cursor with ``self.asset_state_store.aset``, as Airflow's documentation shows.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger

POLL = 0.1


def _new_items(index: int, after: int) -> list[int]:
    folder = Path(os.environ["LOCALSTATE_E2E_SOURCE"]) / str(index)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n for n in map(int, names) if n > after)


class _SourceTrigger(BaseEventTrigger):
    """A watcher of source `index`: its one argument, serialized by its own class name."""

    def __init__(self, *, index: int) -> None:
        super().__init__()
        self.index = index

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {"index": self.index})


class PlainSourceTrigger(_SourceTrigger):
    """Yield the event, then save the cursor in Airflow's ``asset_state_store``."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = self.asset_state_store
        assert store is not None, "run this trigger as an Asset Watcher"
        last = int(await store.aget("cursor", default=0))  # type: ignore[arg-type]
        while True:
            for n in _new_items(self.index, last):
                yield TriggerEvent({"n": n})
                await store.aset("cursor", n)
                last = n
            await asyncio.sleep(POLL)


class EmitSourceTrigger(StateEnabledTrigger, _SourceTrigger):
    """Emit each item with the watermark it advances to: one commit, exactly once."""

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last = int(await self.get_watermark(default=0))
        while True:
            for n in _new_items(self.index, last):
                await self.emit({"n": n}, watermark=n)
                last = n
            await asyncio.sleep(POLL)
        yield TriggerEvent({})  # pragma: no cover - makes run() an async generator
