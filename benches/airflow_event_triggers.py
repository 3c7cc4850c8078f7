"""Watcher triggers for `bench_events.py`: asset events as fast as they go, or at a rate.

Each waits until the file ``$LOCALSTATE_BENCH_GO/<label>`` exists (the bench runs one phase at
a time), then produces `count` events at `rate` events/s (0: as fast as it can), each with
payload ``{"n": n, "t": time.time()}``, and idles.

* `YieldEventsTrigger`: Airflow's own path, ``yield TriggerEvent(payload)`` (the supervisor
  commits each through ``Trigger.submit_event``);
* `EmitEventsTrigger`: localstate's ``await self.emit(payload, watermark=n)`` (``sink = api``:
  the plugin commits a batch of events with the watermark in one transaction).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger


async def _go(label: str) -> None:
    flag = Path(os.environ["LOCALSTATE_BENCH_GO"]) / label
    while not flag.exists():  # a file another process creates: nothing to await  # noqa: ASYNC110
        await asyncio.sleep(0.2)


async def _paced(count: int, rate: float) -> AsyncIterator[int]:
    start = time.monotonic()
    for n in range(1, count + 1):
        if rate > 0:
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        yield n


class _PhaseTrigger(BaseEventTrigger):
    """A watcher of phase `label`: `count` events at `rate` per second (0: at once)."""

    def __init__(self, *, label: str, count: int, rate: float) -> None:
        super().__init__()
        self.label = label
        self.count = count
        self.rate = rate

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"label": self.label, "count": self.count, "rate": self.rate})


class YieldEventsTrigger(_PhaseTrigger):
    async def run(self) -> AsyncIterator[TriggerEvent]:
        await _go(self.label)
        async for n in _paced(self.count, self.rate):
            yield TriggerEvent({"n": n, "t": time.time()})
            if self.rate <= 0 and n % 100 == 0:
                await asyncio.sleep(0)
        await asyncio.Event().wait()


class EmitEventsTrigger(StateEnabledTrigger, _PhaseTrigger):
    async def run(self) -> AsyncIterator[TriggerEvent]:
        await _go(self.label)
        async for n in _paced(self.count, self.rate):
            await self.emit({"n": n, "t": time.time()}, watermark=n)
        await asyncio.Event().wait()
        yield TriggerEvent({})  # pragma: no cover - makes run() an async generator
