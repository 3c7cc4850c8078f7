"""`FlushWaiters`: the calls waiting until the central DB holds a version of a key.

Owned by the `SyncWorker`: a ``central``-durability write registers here (`expect`) before any
await a flush could overtake, and the flush's `mark_clean` settles the waiters of every key it
settles (`settle`). A waiter is settled once, with success or the error that ends it.
"""

from __future__ import annotations

import asyncio

from localstate._cache.entry import StateKey
from localstate._core.futures import mark_retrieved

__all__ = ["FlushWaiters"]


class FlushWaiters:
    __slots__ = ("pending",)

    def __init__(self) -> None:
        #: key -> (version, future) of each waiter; read it, change it through the methods
        self.pending: dict[StateKey, list[tuple[int, asyncio.Future[None]]]] = {}

    def expect(self, key: StateKey, version: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.setdefault(key, []).append((version, fut))
        return fut

    def drop(self, key: StateKey, fut: asyncio.Future[None]) -> None:
        waiters = self.pending.get(key)
        if waiters is not None:
            waiters[:] = [(v, f) for v, f in waiters if f is not fut]
            if not waiters:
                del self.pending[key]

    def settle(self, key: StateKey, version: int, error: BaseException | None,
               *, every: bool = False) -> None:
        """End the waiters of `key` for `version` or below (`every`: all of them)."""
        waiters = self.pending.get(key)
        if not waiters:
            return
        for v, fut in waiters:
            if (every or v <= version) and not fut.done():
                _end(fut, error)

    def fail_all(self, error: BaseException) -> None:
        """End every waiter with `error` and forget them (the worker stops)."""
        for waiters in self.pending.values():
            for _version, fut in waiters:
                if not fut.done():
                    _end(fut, error)
        self.pending.clear()


def _end(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
        fut.add_done_callback(mark_retrieved)
