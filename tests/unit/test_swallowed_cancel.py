"""`raise_swallowed_cancel`: a cancel that `asyncio.wait_for` dropped (Python 3.11, the task
cancelled as the awaited call completes) ends a watcher's loop at its next turn."""

from __future__ import annotations

import asyncio

from localstate._core.swallowed_cancel import raise_swallowed_cancel


async def test_a_cancel_dropped_by_wait_for_ends_the_loop_at_its_next_turn() -> None:
    loop = asyncio.get_running_loop()
    calls: list[asyncio.Future[None]] = []

    async def watcher() -> None:
        while True:
            raise_swallowed_cancel()
            call = loop.create_future()
            calls.append(call)
            await asyncio.wait_for(call, 5)  # a library call with a timeout (redis-py's writes)

    task = asyncio.create_task(watcher())
    await asyncio.sleep(0)  # the watcher waits on its first call
    # the cancel lands as the call completes: both before the watcher runs again
    calls[0].set_result(None)
    task.cancel()
    for _ in range(5):  # a few turns of the event loop, no clock involved
        await asyncio.sleep(0)
    # Python 3.11's wait_for returned the result and dropped the cancel: without the check
    # the watcher would now wait on a second call, for good
    assert task.cancelled()
    assert len(calls) == 1


async def test_a_task_not_cancelled_goes_on() -> None:
    raise_swallowed_cancel()  # nothing pending: no error


async def test_a_cancel_absorbed_on_purpose_is_not_raised_again() -> None:
    async def absorbs() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            # what a task that means to absorb a cancel does (Python 3.11+; 3.10 keeps no count)
            uncancel = getattr(asyncio.current_task(), "uncancel", None)
            if uncancel is not None:
                uncancel()
        raise_swallowed_cancel()
        return "went on"

    task = asyncio.create_task(absorbs())
    await asyncio.sleep(0)
    task.cancel()
    assert await task == "went on"
