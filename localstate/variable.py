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

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from localstate.model import Durability, Record

if TYPE_CHECKING:
    from localstate.config import Settings

__all__ = ["ClassOrInstance", "StateVariable", "VariableStore"]

_PC = ParamSpec("_PC")
_RC = TypeVar("_RC")
_PI = ParamSpec("_PI")
_RI = TypeVar("_RI")
_S = TypeVar("_S")


class ClassOrInstance(Generic[_PC, _RC, _S, _PI, _RI]):
    """A method that does one thing called on the class and another on an instance (the
    class-level and handle calls of both `StateVariable`s: this one and the blocking one)."""

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


class VariableStore(Protocol):
    """What a handle and the class-level calls use of a store (`StateStore` has it)."""

    @property
    def triggerer_id(self) -> str: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def closed(self) -> bool: ...
    async def close(self) -> None: ...

    async def get(self, owner: str, key: str, default: Any = None) -> Any: ...
    async def set(self, owner: str, key: str, value: Any, *,
                  durability: Durability | None = None) -> int: ...
    async def delete(self, owner: str, key: str, *, durability: Durability | None = None
                     ) -> bool: ...
    async def record(self, owner: str, key: str) -> Record | None: ...
    async def compare_and_set(self, owner: str, key: str, value: Any, *, expected_version: int,
                              durability: Durability | None = None) -> int: ...


async def _default() -> VariableStore:
    # imported on use: the default store's module opens a StateStore, whose `variable()`
    # makes handles of this module (the store does not depend on the default store)
    from localstate.default_store import DEFAULT

    return await DEFAULT.get()


async def _class_get(key: str, *, owner: str, default: Any = None) -> Any:
    return await (await _default()).get(owner, key, default)


async def _class_set(
    key: str, value: Any, *, owner: str, durability: Durability | None = None
) -> int:
    return await (await _default()).set(owner, key, value, durability=durability)


async def _class_delete(key: str, *, owner: str) -> bool:
    return await (await _default()).delete(owner, key)


class StateVariable:
    """One state variable: a key and its owner, in a store."""

    def __init__(self, key: str, *, owner: str, store: VariableStore) -> None:
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

    get = ClassOrInstance(_class_get, _get)
    set = ClassOrInstance(_class_set, _set)
    delete = ClassOrInstance(_class_delete, _delete)

    async def record(self) -> Record | None:
        return await self.store.record(self.owner, self.key)

    async def compare_and_set(self, value: Any, *, expected_version: int) -> int:
        return await self.store.compare_and_set(
            self.owner, self.key, value, expected_version=expected_version
        )

    @staticmethod
    def configure(store: VariableStore | None) -> None:
        """Make `store` (a `StateStore`) the process's default store (None: open one from
        the settings on first use)."""
        from localstate.default_store import DEFAULT  # imported on use, as in `_default`

        DEFAULT.configure(store)

    @staticmethod
    def default_store() -> VariableStore | None:
        from localstate.default_store import DEFAULT  # imported on use, as in `_default`

        return DEFAULT.current()
