"""The process's default store: one slot, one lock and one opening for every path.

The async class-level calls (`localstate.StateVariable.get/set/delete`), Airflow triggers
(`localstate.airflow.trigger`) and the blocking class-level calls
(`localstate.blocking.StateVariable`) all take the process's default store from one
`DefaultStore`, `localstate._store.DEFAULT`. It is given with `configure`, else opened on first
use by the opener the caller names (``StateStore.open``, or ``BlockingStateStore``: from the
settings), once per process (a second store over the same cache file could not open: its file
lock is held). The slot knows a store only by what it needs of one (`ClosableStore`), so that
the store's module can hold the one slot without this module importing it.

The slot holds the store and the event loop it runs on, and, when the blocking path opened it
or was given it, the blocking front whose thread runs that loop. A threading lock guards the
slot and is never held across an await; two coroutines of one loop that both find the slot empty
open one store between them (an asyncio lock of that loop).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar, cast

from localstate.errors import LocalStateError

__all__ = ["BlockingFront", "ClosableStore", "DefaultStore"]


class ClosableStore(Protocol):
    """What the slot needs of a store (`StateStore` has it)."""

    @property
    def closed(self) -> bool: ...


_S = TypeVar("_S", bound=ClosableStore)
_S_co = TypeVar("_S_co", bound=ClosableStore, covariant=True)


class BlockingFront(Protocol[_S_co]):
    """A store running on an event loop of its own thread (`BlockingStateStore` is one)."""

    @property
    def store(self) -> _S_co: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...


_F = TypeVar("_F", bound=BlockingFront[Any])


class DefaultStore(Generic[_S]):
    """The slot of the process's default store (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._store: _S | None = None
        #: the loop `_store` runs on (None: given outside a loop, any caller's)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._front: BlockingFront[_S] | None = None
        #: the front was opened here (closed here, and at exit), not given to configure()
        self._owned = False
        self._opening: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._atexit = False

    def _live(self) -> _S | None:
        store = self._store
        return store if store is not None and not store.closed else None

    # -- the async path (class-level calls, Airflow triggers) ----------------------------

    async def get(self, open_store: Callable[[], Awaitable[_S]]) -> _S:
        """The default store, for a caller on the loop it runs on (opened here with
        `open_store` if none)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                store = self._live()
                if store is not None:
                    if self._loop is not None and self._loop is not loop:
                        raise LocalStateError(
                            "the default StateStore belongs to another event loop; call "
                            "StateVariable.configure(store) in this loop, or use the sync API"
                        )
                    return store
                if self._opening is None or self._opening[0] is not loop:
                    self._opening = (loop, asyncio.Lock())
                opening = self._opening[1]
            async with opening:
                with self._lock:
                    if self._live() is not None:
                        continue  # opened meanwhile: checked again above
                store = await open_store()
                with self._lock:
                    self._store, self._loop, self._front, self._owned = store, loop, None, False
                return store

    def configure(self, store: _S | None) -> None:
        """Make `store` the default (None: open one on first use). A blocking default opened
        here is closed first."""
        self.close_owned()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._store, self._loop, self._front = store, loop if store else None, None

    def current(self) -> _S | None:
        with self._lock:
            return self._store

    # -- the blocking path ---------------------------------------------------------------

    def get_blocking(self, open_front: Callable[[], _F]) -> _F:
        """The default store's blocking front (opened with `open_front` if there is none)."""
        with self._lock:
            front = self._front
            if front is not None and not front.closed:
                return cast(_F, front)
            if self._live() is not None:
                raise LocalStateError(
                    "the process's default store is an async StateStore on an event loop of "
                    "this process; use localstate.StateVariable there, or give the blocking "
                    "calls a store of their own with localstate.blocking.StateVariable.configure"
                )
            new = open_front()
            self._front, self._store, self._loop, self._owned = new, new.store, new.loop, True
            if not self._atexit:
                atexit.register(self.close_owned)
                self._atexit = True
            return new

    def configure_blocking(self, front: BlockingFront[_S] | None) -> None:
        """Make `front` the default (None: open one on first use); one opened here is closed."""
        self.close_owned()
        with self._lock:
            self._front = front
            self._store, self._loop = (front.store, front.loop) if front else (None, None)

    def current_front(self) -> BlockingFront[_S] | None:
        with self._lock:
            return self._front

    def close_owned(self) -> None:
        """Close the blocking default if it was opened here, and empty the slot then."""
        with self._lock:
            front, owned = self._front, self._owned
            if owned:
                self._store = self._loop = self._front = None
                self._owned = False
        if front is not None and owned:
            front.close()

