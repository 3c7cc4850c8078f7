"""`in_lanes`: run a step over items in order, a few at a time, with an optional deadline.

What `localstate._sync.sinks.airflow_sink.AirflowSink` pipelines its accessor calls with: each lane
takes the next item from one shared iterator, so items start in order and each is taken once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

__all__ = ["in_lanes"]

_T = TypeVar("_T")


async def in_lanes(items: Sequence[_T], step: Callable[[int, _T], Awaitable[None]],
                   lanes: int, deadline: float | None) -> int:
    """Run `step(i, item)` over `items` in order, at most `lanes` at a time; return how many
    were not started because `deadline` (loop time) had passed. Each lane runs at least one."""
    todo: Iterator[tuple[int, _T]] = iter(enumerate(items))
    skipped = 0

    async def lane() -> None:
        nonlocal skipped
        loop = asyncio.get_running_loop()
        first = True
        for i, item in todo:  # one iterator shared by the lanes: each item is taken once
            if not first and deadline is not None and loop.time() >= deadline:
                skipped += 1
                continue
            first = False
            await step(i, item)

    tasks = [asyncio.ensure_future(lane()) for _ in range(min(lanes, len(items)))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:  # the first error (or a cancel) stops the other lanes too
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return skipped
