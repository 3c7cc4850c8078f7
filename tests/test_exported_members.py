"""The public surface of `localstate`: what `__all__` declares is what the package offers, and
everything its calls return or raise is importable from it (as httpx guards its own)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import typing

import pytest

import localstate
from localstate import errors


def test_all_names_resolve_and_are_unique() -> None:
    assert len(localstate.__all__) == len(set(localstate.__all__))
    assert localstate.__all__ == sorted(localstate.__all__, key=lambda n: (n.upper() != n, n))
    for name in localstate.__all__:
        assert getattr(localstate, name) is not None, name


def test_every_typed_error_is_exported() -> None:
    typed = {name for name, obj in vars(errors).items()
             if inspect.isclass(obj) and issubclass(obj, errors.LocalStateError)}
    assert typed, "no error classes found"
    assert typed <= set(localstate.__all__), sorted(typed - set(localstate.__all__))


@pytest.mark.parametrize("method", ["flush", "release", "claim", "get", "record", "stats"])
def test_what_a_store_call_returns_is_exported(method: str) -> None:
    """Each localstate type in the return annotation of a `StateStore` call is exported."""
    hints = typing.get_type_hints(getattr(localstate.StateStore, method))
    returned = hints["return"]
    for candidate in (returned, *typing.get_args(returned)):
        if inspect.isclass(candidate) and candidate.__module__.startswith("localstate"):
            assert getattr(localstate, candidate.__name__, None) is candidate, (
                method, candidate)


def test_importing_the_package_loads_no_store() -> None:
    """The store and what is built on it load on first use (the lower layers import the
    package first): `import localstate` alone must not pull them in."""
    code = ("import sys, localstate; "
            "print(sorted(m for m in ('localstate.store', 'localstate.sync.settle') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"
