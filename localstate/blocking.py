"""The synchronous API, for code with no event loop: tasks, workers, the scheduler, scripts.

    from localstate.blocking import BlockingStateStore, StateVariable

    with BlockingStateStore(central_url="postgresql://airflow@db/airflow") as store:
        store.set("dag:etl/load", "cursor", 42)
        store.get("dag:etl/load", "cursor")              # 42

    StateVariable.set("cursor", 42, owner="dag:etl/load")    # on the process's default store
    StateVariable.get("cursor", owner="dag:etl/load", default=0)

`BlockingStateStore` runs a `StateStore` on an event loop of its own, on a background thread,
and hands every call over to it: any number of threads may call it at once, and each call
blocks until the store has answered, with the store's own semantics (a ``local`` set returns
once the local commit holds it, a ``central`` one once the central DB does). Errors cross the
thread boundary as they are: the same typed `LocalStateError` subclasses the async store raises.

The sync `StateVariable` here mirrors `localstate.StateVariable` call for call, minus the
``await``. It is a class of its own, not a mode of the async one, so that each has exact types:
``StateVariable.get`` here returns the value, there a coroutine, and a type checker (and a
reader) knows which from the import alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import warnings
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar

from localstate._core.class_or_instance import ClassOrInstance
from localstate._core.config import Settings
from localstate._core.model import Durability, Record
from localstate._stats import StoreStats
from localstate._store import DEFAULT, StateStore
from localstate._sync.flush.settle import FlushReport
from localstate.errors import LocalStateError, StoreClosed

__all__ = ["BlockingStateStore", "StateVariable"]

_T = TypeVar("_T")


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    # The thread's target holds the loop only, never the BlockingStateStore, so that an
    # unclosed store can still be collected (and warn).
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _shut_down(store: StateStore) -> None:
    """Close the store, then end every call still waiting (they raise StoreClosed)."""
    try:
        await store.close()
    finally:
        current = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


class BlockingStateStore:
    """A thread-safe, blocking front for a `StateStore` running on a background thread.

    Takes the keyword arguments of `StateStore` (``central_url=``, ``durability=``,
    ``settings=``, ...); opens the store before the constructor returns, raising its error
    if it cannot. Close it with `close()` (safe twice) or use it as a context manager.
    """

    def __init__(self, **options: Any) -> None:
        self._closed = False
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_serve, args=(self._loop,),
                                        name="localstate-blocking", daemon=True)
        self._thread.start()
        try:
            self._store: StateStore = self._call(StateStore.open(**options))
        except BaseException:
            self._closed = True
            self._stop_thread()
            raise

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the store (it flushes for up to ``close_timeout``) and end its thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._submit(_shut_down(self._store)).result()
        finally:
            self._stop_thread()

    def _stop_thread(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            if threading.current_thread() is not self._thread:
                self._thread.join()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> BlockingStateStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if getattr(self, "_closed", True):
            return
        _warn("BlockingStateStore was never closed; closing it now (call close() or use "
              "`with`)", ResourceWarning, stacklevel=1)
        self._closed = True
        # close without waiting: __del__ may run on any thread, this store's own included
        loop = self._loop
        if loop.is_closed():  # its thread is gone already (interpreter exit)
            return
        fut = asyncio.run_coroutine_threadsafe(_shut_down(self._store), loop)
        fut.add_done_callback(lambda _f: loop.call_soon_threadsafe(loop.stop))

    # -- handing calls over --------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if threading.current_thread() is self._thread:
            coro.close()
            raise LocalStateError(
                "a BlockingStateStore was called from its own event loop thread (from a "
                "callback of the store?): it would wait for itself forever; use the async "
                "store there (`blocking_store.store`)"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._closed:
            coro.close()
            raise StoreClosed("this BlockingStateStore is closed; open a new one")
        fut = self._submit(coro)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise StoreClosed("the BlockingStateStore was closed during this call") from None

    # -- the store's calls ---------------------------------------------------------------

    @property
    def store(self) -> StateStore:
        """The async store behind this one (use it only on its own loop thread)."""
        return self._store

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def settings(self) -> Settings:
        return self._store.settings

    @property
    def triggerer_id(self) -> str:
        return self._store.triggerer_id

    def get(self, owner: str, key: str, default: Any = None) -> Any:
        return self._call(self._store.get(owner, key, default))

    def get_many(self, owner: str, keys: Iterable[str]) -> dict[str, Any]:
        return self._call(self._store.get_many(owner, list(keys)))

    def record(self, owner: str, key: str) -> Record | None:
        return self._call(self._store.record(owner, key))

    def read_committed(self, owner: str, key: str) -> Record | None:
        """`StateStore.read_committed`: the central DB's record, read now."""
        return self._call(self._store.read_committed(owner, key))

    def items(self, owner: str) -> list[Record]:
        async def collect() -> list[Record]:
            return [r async for r in self._store.items(owner)]

        return self._call(collect())

    def set(self, owner: str, key: str, value: Any, *, durability: Durability | None = None
            ) -> int:
        return self._call(self._store.set(owner, key, value, durability=durability))

    def compare_and_set(self, owner: str, key: str, value: Any, *, expected_version: int,
                        durability: Durability | None = None) -> int:
        return self._call(self._store.compare_and_set(
            owner, key, value, expected_version=expected_version, durability=durability))

    def delete(self, owner: str, key: str, *, durability: Durability | None = None) -> bool:
        return self._call(self._store.delete(owner, key, durability=durability))

    def load(self, owner: str) -> int:
        return self._call(self._store.load(owner))

    def flush(self) -> FlushReport:
        return self._call(self._store.flush())

    def reconfigure(self, settings: Settings) -> tuple[str, ...]:
        return self._call(self._store.reconfigure(settings))

    def stats(self) -> StoreStats:
        async def read() -> StoreStats:  # read on the loop thread, where the map changes
            return self._store.stats()

        return self._call(read())

    def variable(self, key: str, *, owner: str) -> StateVariable:
        """A handle on one state variable: ``sv.get()``, ``sv.set(v)``."""
        return StateVariable(key, owner=owner, store=self)


def _default() -> BlockingStateStore:
    return DEFAULT.get_blocking(BlockingStateStore)


def _class_get(key: str, *, owner: str, default: Any = None) -> Any:
    return _default().get(owner, key, default)


def _class_set(key: str, value: Any, *, owner: str, durability: Durability | None = None
               ) -> int:
    return _default().set(owner, key, value, durability=durability)


def _class_delete(key: str, *, owner: str) -> bool:
    return _default().delete(owner, key)


class StateVariable:
    """One state variable, with blocking calls (see `localstate.StateVariable` for async)."""

    def __init__(self, key: str, *, owner: str, store: BlockingStateStore) -> None:
        self.key = key
        self.owner = owner
        self.store = store

    def __repr__(self) -> str:
        return f"StateVariable(owner={self.owner!r}, key={self.key!r}, blocking)"

    def _get(self, default: Any = None) -> Any:
        return self.store.get(self.owner, self.key, default)

    def _set(self, value: Any, *, durability: Durability | None = None) -> int:
        return self.store.set(self.owner, self.key, value, durability=durability)

    def _delete(self) -> bool:
        return self.store.delete(self.owner, self.key)

    get = ClassOrInstance(_class_get, _get)
    set = ClassOrInstance(_class_set, _set)
    delete = ClassOrInstance(_class_delete, _delete)

    def record(self) -> Record | None:
        return self.store.record(self.owner, self.key)

    def compare_and_set(self, value: Any, *, expected_version: int) -> int:
        return self.store.compare_and_set(self.owner, self.key, value,
                                          expected_version=expected_version)

    @staticmethod
    def configure(store: BlockingStateStore | None) -> None:
        """Make `store` the process's default store (None: open one from config on first use).

        A default the blocking calls opened themselves is closed first.
        """
        DEFAULT.configure_blocking(store)

    @staticmethod
    def default_store() -> BlockingStateStore | None:
        front = DEFAULT.current_front()
        return front if isinstance(front, BlockingStateStore) else None
