"""`MadeTogether`: calls made together in few transactions (a group commit), a few at a time.

The central store makes a storm of claims, or of reads of whole owners, this way: hundreds of
triggers moving to one triggerer at once cost a few transactions instead of one each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from localstate.errors import LocalStateError

__all__ = ["MadeTogether"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class MadeTogether(Generic[_T, _R]):
    """Calls made together (a group commit): a storm of claims or of reads of owners,
    hundreds of triggers moving here at once, costs a few transactions instead of one each.

    Each call waits for one of `slots`; whoever gets one takes every waiting call (up to
    `group`, each owner once, oldest first) and makes them in one go (`make`: their items ->
    each owner's result). A call made meanwhile by another finds its result, or the error
    that failed their transaction (a caller retries it as any failed call), when it gets a
    slot. Runs on the event loop of its store.
    """

    def __init__(self, slots: asyncio.Semaphore, owner_of: Callable[[_T], str],
                 make: Callable[[list[_T]], Awaitable[dict[str, _R]]], group: int) -> None:
        self._slots = slots
        self._group = group
        self._owner_of = owner_of
        self._make = make
        #: calls waiting for a slot, in order, each with its result to be
        self._waiting: list[tuple[_T, asyncio.Future[_R]]] = []

    async def __call__(self, item: _T) -> _R:
        done: asyncio.Future[_R] = asyncio.get_running_loop().create_future()
        mine = (item, done)
        self._waiting.append(mine)
        try:
            while not done.done():
                async with self._slots:
                    if not done.done():
                        await self._make_waiting()
        finally:
            if not done.done():  # cancelled: made by nobody, or by a group nobody awaits
                self._waiting = [w for w in self._waiting if w[1] is not done]
                done.add_done_callback(lambda f: f.cancelled() or f.exception())
        return done.result()

    def _take(self) -> list[tuple[_T, asyncio.Future[_R]]]:
        """The waiting calls the next go makes: the oldest, each owner once."""
        taken: list[tuple[_T, asyncio.Future[_R]]] = []
        left: list[tuple[_T, asyncio.Future[_R]]] = []
        owners: set[str] = set()
        for waiting in self._waiting:
            owner = self._owner_of(waiting[0])
            if owner in owners or len(taken) >= self._group:
                left.append(waiting)
            else:
                owners.add(owner)
                taken.append(waiting)
        self._waiting = left
        return taken

    async def _make_waiting(self) -> None:
        """Make the waiting calls; resolve each with its result, or all with the error that
        failed them. Cancelled, the calls not made wait again for a slot."""
        group = self._take()
        try:
            results = await self._make([item for item, _done in group])
        except LocalStateError as exc:
            for _item, done in group:
                done.set_exception(exc)
            return
        except BaseException:
            self._waiting[:0] = group
            raise
        for item, done in group:
            done.set_result(results[self._owner_of(item)])
