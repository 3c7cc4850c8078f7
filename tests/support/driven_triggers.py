"""Triggers run in the test's process as a triggerer runs them (`drive`: greenback's portal,
then ``run()``), and `EmittingTrigger`, which emits a numbered range exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import greenback
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from localstate.airflow.trigger import StateEnabledTrigger


async def drive(trigger: BaseEventTrigger, events: int) -> list[Any]:
    """Run the trigger as a triggerer does (greenback portal, then run()), for `events`."""
    await greenback.ensure_portal()
    got: list[Any] = []
    stream = trigger.run()
    async for event in stream:
        got.append(event.payload)
        if len(got) == events:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    return got


class EmittingTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Emits items watermark+1 .. `last` with `emit` (exactly once), then ends; never yields."""

    def __init__(self, *, source: str, last: int) -> None:
        super().__init__()
        self.source = source
        self.last = last

    def serialize(self) -> tuple[str, dict[str, Any]]:
        # `last` stays out: the same trigger, run further (its owner hashes its kwargs)
        return (f"{__name__}.EmittingTrigger", {"source": self.source})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        n = await self.get_watermark(default=0)
        while n < self.last:
            n += 1
            await self.emit({"item": n}, watermark=n)
        return
        yield  # never reached: run() is the async generator Airflow expects
