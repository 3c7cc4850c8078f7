"""Running a queue watcher in-process against a real broker and a real central DB, for the
queue tests (tests/test_airflow_queues_*.py): the trigger runs as the triggerer runs it
(greenback portal, then ``run()``) in a task, until the central DB holds the events expected."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import greenback
from airflow.triggers.base import BaseEventTrigger
from sqlalchemy import select

from localstate import StateStore, StateVariable
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.schema import event


async def committed_keys(central_url: str, owner: str) -> list[str]:
    """The keys of `owner`'s events the central DB holds, in commit order."""
    async with CentralStore.open(central_url) as central:
        e = event.c
        return [str(k) for (k,) in await central.run_read(
            select(e.key).where(e.owner == owner).order_by(e.committed_at, e.seq),
            "read events")]


#: seconds a cancelled trigger gets to end (a triggerer waits on it the same way)
CANCEL_BOUND = 30.0


@contextlib.asynccontextmanager
async def running(trigger: BaseEventTrigger, store: StateStore
                  ) -> AsyncIterator[asyncio.Task[None]]:
    """`trigger` running on `store` (the process store) until the block ends (then cancelled,
    as a triggerer cancels a trigger that moves away)."""
    StateVariable.configure(store)

    async def run() -> None:
        await greenback.ensure_portal()
        async for _ in trigger.run():
            pass

    task = asyncio.create_task(run(), name=f"run {trigger!r}")
    try:
        yield task
    finally:
        task.cancel()
        # a trigger that outlives its cancel is a failure to report, not a suite that hangs
        await asyncio.wait({task}, timeout=CANCEL_BOUND)
        StateVariable.configure(None)
        if not task.done():
            raise AssertionError(f"{trigger!r} still runs {CANCEL_BOUND:g} s after its cancel")
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_for_keys(central_url: str, owner: str, count: int, store: StateStore,
                        task: asyncio.Task[None], timeout: float = 60.0) -> list[str]:
    """Flush `store` until the central DB holds `count` events of `owner` (or `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        if task.done():
            task.result()  # the trigger failed: its error is the test's
            raise AssertionError("the trigger's run() ended")
        await store.flush()
        keys = await committed_keys(central_url, owner)
        if len(keys) >= count or time.monotonic() > deadline:
            return keys
        await asyncio.sleep(0.1)


async def wait_for_watermark(store: StateStore, owner: str, expected: object,
                             timeout: float = 60.0) -> None:
    """Wait until `owner`'s watermark in `store` is `expected` (the trigger got that far)."""
    deadline = time.monotonic() + timeout
    for _ in iter(int, 1):
        if await store.get(owner, "watermark") == expected:
            return
        assert time.monotonic() < deadline, f"watermark not {expected!r} in {timeout:g} s"
        await asyncio.sleep(0.05)
