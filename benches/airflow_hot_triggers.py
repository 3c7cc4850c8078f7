"""Watcher triggers for `bench_airflow_triggerer.py`: ``asset_state_store.aset`` in a hot loop.

`HotAsetTrigger` is written against Airflow 3.3's own API; `LocalHotAsetTrigger` is the same
code with localstate's mixin added (the drop-in). Each sets the watermark as fast as it can for
`seconds`, then reports how many sets it made in one event, and idles.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger


class HotAsetTrigger(BaseEventTrigger):
    def __init__(self, *, seconds: float, label: str) -> None:
        super().__init__()
        self.seconds = seconds
        self.label = label

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"seconds": self.seconds, "label": self.label})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        store = self.asset_state_store
        assert store is not None, "run this trigger as an Asset Watcher"
        await store.aset("watermark", 0)  # the first write (and any read-through) untimed
        n = 0
        started = time.perf_counter()
        while time.perf_counter() - started < self.seconds:
            n += 1
            await store.aset("watermark", n)
        elapsed = time.perf_counter() - started
        yield TriggerEvent({"label": self.label, "sets": n, "seconds": elapsed})
        await asyncio.Event().wait()  # report once, then idle until cancelled


class LocalHotAsetTrigger(StateEnabledTrigger, HotAsetTrigger):
    """The same code, served by localstate's local cache (flushed to Airflow's store)."""
