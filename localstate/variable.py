"""`StateVariable`: the seed's model, as a handle and as class-level calls.

As a handle on one variable of a store::

    sv = store.variable("watermark", owner="asset_watcher:orders")
    await sv.set(41)
    await sv.get(default=0)

As class-level calls on the process's default store, mirroring Airflow's ``Variable.get/set``::

    await StateVariable.set("watermark", 41, owner="asset_watcher:orders")
    await StateVariable.get("watermark", owner="asset_watcher:orders", default=0)

The default store is the one given to `StateVariable.configure(store)`, else one opened from
the settings (environment, ``airflow.cfg``) on first use, in the running event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from localstate.errors import LocalStateError
from localstate.model import Durability, Record
from localstate.store import StateStore

__all__ = ["StateVariable", "process_store"]

_PC = ParamSpec("_PC")
_RC = TypeVar("_RC")
_PI = ParamSpec("_PI")
_RI = TypeVar("_RI")
_S = TypeVar("_S")


class _ClassOrInstance(Generic[_PC, _RC, _S, _PI, _RI]):
    """A method that does one thing called on the class and another on an instance."""

    def __init__(
        self, on_class: Callable[_PC, _RC], on_instance: Callable[Concatenate[_S, _PI], _RI]
    ) -> None:
        self._on_class = on_class
        self._on_instance = on_instance

    @overload
    def __get__(self, obj: None, objtype: type[Any]) -> Callable[_PC, _RC]: ...
    @overload
    def __get__(self, obj: _S, objtype: type[Any] | None = None) -> Callable[_PI, _RI]: ...
    def __get__(self, obj: Any, objtype: type[Any] | None = None) -> Any:
        if obj is None:
            return self._on_class
        return functools.partial(self._on_instance, obj)


class _DefaultStore:
    """The process's default store for class-level calls, opened lazily once per loop."""

    store: StateStore | None = None
    _lock: asyncio.Lock | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def get(cls) -> StateStore:
        loop = asyncio.get_running_loop()
        if cls.store is not None and not cls.store.closed:
            if cls._loop is not None and cls._loop is not loop:
                raise LocalStateError(
                    "the default StateStore belongs to another event loop; call "
                    "StateVariable.configure(store) in this loop, or use the sync API"
                )
            return cls.store
        if cls._lock is None or cls._loop is not loop:
            cls._lock, cls._loop = asyncio.Lock(), loop
        async with cls._lock:
            if cls.store is None or cls.store.closed:
                cls.store = await StateStore.open()
        return cls.store


async def process_store() -> StateStore:
    """The process's default store (`StateVariable.configure`, else opened from the settings
    once, on first use): the one opener of it for class-level calls and Airflow triggers."""
    return await _DefaultStore.get()


async def _class_get(key: str, *, owner: str, default: Any = None) -> Any:
    return await (await _DefaultStore.get()).get(owner, key, default)


async def _class_set(
    key: str, value: Any, *, owner: str, durability: Durability | None = None
) -> int:
    return await (await _DefaultStore.get()).set(owner, key, value, durability=durability)


async def _class_delete(key: str, *, owner: str) -> bool:
    return await (await _DefaultStore.get()).delete(owner, key)


class StateVariable:
    """One state variable: a key and its owner, in a store."""

    def __init__(self, key: str, *, owner: str, store: StateStore) -> None:
        self.key = key
        self.owner = owner
        self.store = store

    def __repr__(self) -> str:
        return f"StateVariable(owner={self.owner!r}, key={self.key!r})"

    async def _get(self, default: Any = None) -> Any:
        return await self.store.get(self.owner, self.key, default)

    async def _set(self, value: Any, *, durability: Durability | None = None) -> int:
        return await self.store.set(self.owner, self.key, value, durability=durability)

    async def _delete(self) -> bool:
        return await self.store.delete(self.owner, self.key)

    get = _ClassOrInstance(_class_get, _get)
    set = _ClassOrInstance(_class_set, _set)
    delete = _ClassOrInstance(_class_delete, _delete)

    async def record(self) -> Record | None:
        return await self.store.record(self.owner, self.key)

    async def compare_and_set(self, value: Any, *, expected_version: int) -> int:
        return await self.store.compare_and_set(
            self.owner, self.key, value, expected_version=expected_version
        )

    @staticmethod
    def configure(store: StateStore | None) -> None:
        """Make `store` the default of the class-level calls (None: open one from config)."""
        _DefaultStore.store = store
        _DefaultStore._loop = None
        _DefaultStore._lock = None
        if store is not None:
            try:
                _DefaultStore._loop = asyncio.get_running_loop()
            except RuntimeError:
                _DefaultStore._loop = None

    @staticmethod
    def default_store() -> StateStore | None:
        return _DefaultStore.store
