"""The mixin's cleanup releases its owner; a trigger done for good can delete its state."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from conftest import StoreFactory
from driven_triggers import drive
from test_airflow_trigger import CountingTrigger, use

from localstate._sync.central.central_store import CentralStore
from localstate.airflow.trigger import StateEnabledTrigger


class OneShotTrigger(StateEnabledTrigger, BaseEventTrigger):
    """A deferrable operator's trigger: advances its cursor, fires once, ends."""

    forget_state_when_done: ClassVar[bool] = True

    def __init__(self, *, job: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # Airflow: unannotated
        self.job = job

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{__name__}.OneShotTrigger", {"job": self.job})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.set_watermark(await self.get_watermark(default=0) + 1)
        await self.state_variable("cursor").set("c")
        yield TriggerEvent("done")  # type: ignore[no-untyped-call]


async def test_cleanup_releases_the_owner(open_store: StoreFactory, central_url: str) -> None:
    store = await use(await open_store())
    trigger = CountingTrigger(source="leaving")
    await drive(trigger, 5)
    key = (trigger.state_owner, "watermark")
    assert key in store.entry_table.entries
    await trigger.cleanup()
    assert key not in store.entry_table.entries  # flushed, then dropped
    central = await CentralStore.open(central_url)
    try:
        assert (await central.read_many([key]))[key].data == "4"
    finally:
        await central.close()
    assert await drive(CountingTrigger(source="leaving"), 2) == [5, 6]  # read back through


async def test_a_trigger_done_for_good_forgets_its_state(open_store: StoreFactory,
                                                         central_url: str) -> None:
    store = await use(await open_store())
    trigger = OneShotTrigger(job="a")
    events = [event.payload async for event in trigger.run()]  # runs to its end
    assert events == ["done"]
    owner = trigger.state_owner
    assert owner.startswith("trigger:")
    assert not store.entry_table.keys_of(owner)
    central = await CentralStore.open(central_url)
    try:
        rows = await central.read_owner(owner)
        assert {r.key: r.data for r in rows} == {"watermark": None, "cursor": None}  # tombstones
    finally:
        await central.close()
    # a trigger stopped before its end (moved) keeps its state
    moved = OneShotTrigger(job="b")
    assert await drive(moved, 1) == ["done"]
    assert await store.get(moved.state_owner, "watermark") == 1
