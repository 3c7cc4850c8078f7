"""The public surface of `localstate`: what `__all__` declares is what the package offers, and
everything its calls return or raise is importable from it (as httpx guards its own)."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
import typing
from importlib import metadata
from pathlib import Path

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
            "print(sorted(m for m in ('localstate._store', 'localstate._sync.flush.settle') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"


# -- the public modules ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
#: what code outside localstate imports (docs/architecture.md, "Public surface"); the rest,
#: all of localstate._sync included, is internal
PUBLIC_MODULES = ("localstate", "localstate.errors", "localstate.blocking", "localstate.client",
                  "localstate.airflow.trigger", "localstate.airflow.hook",
                  "localstate.airflow.queues",
                  "localstate.airflow.plugin",
                  "localstate.airflow.provider", "localstate.airflow.db_manager",
                  "localstate.api", "localstate.cli", "localstate.examples.*")
_IMPORT = re.compile(r"^\s*(?:from\s+(localstate[\w.]*)\s+import|import\s+(localstate[\w.]*))",
                     re.MULTILINE)


def is_public(module: str) -> bool:
    return module in PUBLIC_MODULES or any(
        p.endswith(".*") and module.startswith(p[:-1]) for p in PUBLIC_MODULES)


def test_the_architecture_page_names_the_public_modules() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Public surface", 1)[1].split("\n## ", 1)[0]
    assert sorted(re.findall(r"^\| `(localstate[\w.*]*)` \|", section, re.MULTILINE)) == sorted(
        PUBLIC_MODULES)


@pytest.mark.parametrize("module", [m for m in PUBLIC_MODULES if not m.endswith(".*")])
def test_a_public_module_declares_its_names(module: str) -> None:
    loaded = importlib.import_module(module)
    names = getattr(loaded, "__all__", None)
    assert names, f"{module} declares no __all__"
    for name in names:
        assert getattr(loaded, name, None) is not None, (module, name)


def _user_facing_files() -> list[Path]:
    """What an operator reads and copies: the README, the docs' pages, the examples."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "localstate" / "examples").glob("*.py"))]


def test_the_docs_and_examples_import_only_public_modules() -> None:
    files = _user_facing_files()
    assert len(files) > 20
    found = {(path.relative_to(ROOT).as_posix(), a or b)
             for path in files for a, b in _IMPORT.findall(path.read_text())}
    assert len(found) >= 5  # the README's and the guides' examples do import localstate
    assert sorted((f, m) for f, m in found if not is_public(m)) == []


def test_the_entry_points_name_public_modules() -> None:
    # as installed: the command, the plugin and the provider Airflow finds
    targets = [point.value for point in metadata.distribution("localstate").entry_points]
    assert len(targets) >= 3
    assert [t for t in targets if not is_public(t.split(":", 1)[0])] == []


# -- the rest is private by name --------------------------------------------------------------

def _private(module: str) -> bool:
    """A module whose name has a part starting with `_` (`localstate._store`,
    `localstate._sync.flush.worker`, `localstate.cli._flush`); `__init__` and `__main__` aside."""
    return any(part.startswith("_") and part not in ("__init__", "__main__")
               for part in module.split("."))


def _modules() -> dict[str, Path]:
    from localstate._testing.source_graph import module_files  # installed names

    return module_files()


def test_every_module_is_public_or_private_by_name() -> None:
    """httpx's layout: the public modules keep their names, every other module (sync/'s, the
    benchmark's, the test servers', the migrations') has a private part in its name."""
    modules = _modules()
    assert len(modules) > 100
    assert "localstate._store" in modules
    assert "localstate._sync.flush.worker" in modules  # sync/, as installed
    # a package that holds public modules is public too (`localstate.airflow`)
    holders = {".".join(m.split(".")[:i]) for m in modules if is_public(m)
               for i in range(1, m.count(".") + 1)}
    neither = [m for m in modules if not is_public(m.removesuffix(".__main__"))
               and m not in holders and not _private(m)]
    assert neither == [], "name these modules with a leading _ or list them in PUBLIC_MODULES"
    # and a public module is not private by name, and exists
    assert [m for m in modules if is_public(m) and _private(m)] == []
    assert [p for p in PUBLIC_MODULES if not p.endswith(".*") and p not in modules] == []


def test_the_docs_examples_and_entry_points_name_no_private_module() -> None:
    """What an operator reads, copies or configures names only public modules: `from`/`import`
    lines (checked above) and any other mention of a dotted localstate name (a `-m`, a class
    path in a configuration line)."""
    mentioned = re.compile(r"(?<![\w./])localstate(?:\.\w+)+")
    found = sorted({(path.relative_to(ROOT).as_posix(), name)
                    for path in _user_facing_files() if path.name != "architecture.md"
                    for name in mentioned.findall(path.read_text()) if _private(name)})
    assert found == []
    targets = [point.value for point in metadata.distribution("localstate").entry_points]
    assert [t for t in targets if _private(t)] == []


#: `getLogger("...")` with a literal name
_LOGGER = re.compile(r"getLogger\((\"[^\"]*\"|'[^']*'|[^)]*)\)")


def test_logger_names_are_literal_and_public() -> None:
    """Operators configure loggers by name: each module names its logger with a literal, never
    `__name__` (which the private module names would change), and no name has a private part
    (the loggers `localstate.store` and `localstate.sync.worker`, never with a `_` part)."""
    loggers: dict[str, list[str]] = {}
    for module, path in _modules().items():
        for argument in _LOGGER.findall(path.read_text()):
            loggers.setdefault(argument, []).append(module)
    assert len(loggers) >= 15
    assert [a for a in loggers if a[:1] not in "\"'"] == []
    assert [a for a in loggers if _private(a.strip("\"'"))] == []
    for logger in ('"localstate.store"', '"localstate.sync.worker"', '"localstate.conflicts"',
                   '"localstate.local_cache"', '"localstate.api.audit"'):  # the loggers
        assert logger in loggers
