"""A cancel that a library swallowed, raised again at the top of a watcher's loop.

Python 3.11's `asyncio.wait_for` returns the awaited call's result, and drops the cancel, when
the task is cancelled just as that call completes (CPython gh-86296; 3.12 rewrote `wait_for` on
`asyncio.timeout`, which keeps it). redis-py sends every command through `wait_for` when a
socket timeout is set (its default: 5 s), so a Redis watcher cancelled at that moment polled on
for good: a cancelled trigger that never ended, and a triggerer (or a test) waiting on it.

The task still counts the cancel it was asked for (`Task.cancelling()`, Python 3.11+), and a
task that meant to absorb one calls `Task.uncancel()`: a count above zero at the top of a loop
turn, outside any `asyncio.timeout` block, is a cancel that was lost on the way. Python 3.10
keeps no count; there this does nothing."""

from __future__ import annotations

import asyncio

__all__ = ["raise_swallowed_cancel"]


def raise_swallowed_cancel() -> None:
    """Raise `asyncio.CancelledError` when the current task was cancelled and the cancel never
    reached it (see the module's docstring). Call it where the loop holds nothing half-done."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError("cancelled during a library call that swallowed the cancel")
