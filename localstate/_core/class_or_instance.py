"""`ClassOrInstance`: a method that does one thing called on the class and another on an
instance.

Both `StateVariable`s (`localstate._store.StateVariable` and `localstate.blocking.StateVariable`)
use it: ``StateVariable.get(key, owner=...)`` reads the process's default store, and
``sv.get()`` the store of the handle ``sv``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

__all__ = ["ClassOrInstance"]

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
