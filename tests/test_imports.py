"""Every module imports first, in a fresh interpreter: no import circle bites at run time.

`localstate.sync` is imported by the store, and imports localstate's lower layers; a module of
either package imported first must load. The lower layers must not load the store at all, and
the import graph read from the source (`if TYPE_CHECKING:` imports included) has no circle.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import localstate

PACKAGE_DIR = Path(localstate.__file__).resolve().parent


def all_modules() -> list[str]:
    names = []
    files = [Path(folder, name) for folder, _dirs, found in os.walk(PACKAGE_DIR, followlinks=True)
             for name in found if name.endswith(".py")]  # followlinks: localstate/sync -> sync/
    for path in sorted(files):
        parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        if parts[-2:] == ("migrations", "env"):  # a script Alembic runs inside its context
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(("localstate", *parts)))
    return names


def import_first(module: str, check: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import importlib, sys; importlib.import_module({module!r}); {check}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=PACKAGE_DIR.parent.parent)


def test_the_modules_include_sync_and_the_store() -> None:
    modules = all_modules()
    assert "localstate.conflicts" in modules
    assert "localstate.store" in modules
    assert len(modules) > 60


#: run in a fresh interpreter: loads the third-party packages given, then imports each
#: localstate module first in a child forked from it (an interpreter per module, without paying
#: each time for SQLAlchemy, FastAPI or Airflow, which have no import order of localstate's)
_FORK_IMPORTER = r"""
import importlib, json, os, sys, traceback
modules, warm = json.load(sys.stdin)
for name in warm:
    try:
        importlib.import_module(name)
    except Exception:
        pass  # an optional dependency: the child meets the same error, with a clear message
# airflow.configuration reads the provider info of installed providers, localstate's among
# them: forget what that loaded, so that each child imports localstate from nothing
for name in [m for m in sys.modules if m.split(".")[0] == "localstate"]:
    del sys.modules[name]
failed = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            message = ""
        except BaseException:
            message = traceback.format_exc().strip().splitlines()[-1] or "failed"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if message or status:
        failed[module] = message or f"exit status {status}"
print(json.dumps(failed))
"""


def third_party_imports() -> list[str]:
    """The packages outside localstate that its modules import on load (sorted)."""
    names: set[str] = set()
    for path in module_files().values():
        for node in _top_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in {"localstate", "__future__"})


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = all_modules()
    warm = third_party_imports()
    assert "sqlalchemy" in {n.split(".")[0] for n in warm}
    result = subprocess.run([sys.executable, "-c", _FORK_IMPORTER], input=json.dumps(
        [modules, warm]), capture_output=True, text=True, timeout=600,
        cwd=PACKAGE_DIR.parent.parent)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {}


def test_the_fork_importer_reports_a_module_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "broken_first.py").write_text("import broken_second\n")
    (tmp_path / "broken_second.py").write_text("from broken_first import missing\n")
    result = subprocess.run([sys.executable, "-c", _FORK_IMPORTER],
                            input=json.dumps([["broken_first", "json"], ["orjson"]]),
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    failed = json.loads(result.stdout.strip().splitlines()[-1])
    assert list(failed) == ["broken_first"]
    assert "ImportError" in failed["broken_first"]


@pytest.mark.parametrize("module", [
    "localstate.errors", "localstate.codec", "localstate.model", "localstate.entry",
    "localstate.local_cache", "localstate.config", "localstate.conflicts",
    "localstate.sync.central_store", "localstate.sync.worker",
])
def test_a_lower_layer_does_not_load_the_store(module: str) -> None:
    result = import_first(module, "assert 'localstate.store' not in sys.modules, "
                                  "sorted(m for m in sys.modules if m.startswith('localstate'))")
    assert result.returncode == 0, result.stderr


def test_there_is_no_top_level_sync_package() -> None:
    # as installed: not from the checkout (a PYTHONPATH naming it would put sync/ on the path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", "import sync"], capture_output=True,
                            text=True, cwd="/", timeout=60, env=env)
    assert result.returncode != 0
    assert "No module named 'sync'" in result.stderr


# -- the import graph, read from the source -------------------------------------------------

#: imports made inside a function, on use, that close a circle if counted: the class-level
#: calls of `StateVariable` take the process's default store, which opens a `StateStore`,
#: whose `variable()` makes `StateVariable`s
DEFERRED_ON_PURPOSE = {("localstate.variable", "localstate.default_store")}
#: what `localstate.sync` may import of `localstate`: its lower layers only
SYNC_MAY_IMPORT = {"localstate", "localstate.model", "localstate.codec", "localstate.errors",
                   "localstate.entry", "localstate.entry_table", "localstate.local_cache",
                   "localstate.config", "localstate.file_lock", "localstate.version",
                   # below the store too: the claim epochs a store holds (entry, errors and
                   # sync's rows), and the REST client's error mapping (codec, errors, model)
                   "localstate.sync.claims", "localstate.client",
                   # an emitted event's row and its checks (the outbox's), sent by the flush
                   "localstate.outbox"}


def module_files() -> dict[str, Path]:
    files = {}
    for folder, _dirs, found in os.walk(PACKAGE_DIR, followlinks=True):
        for name in found:
            if name.endswith(".py"):
                path = Path(folder, name)
                parts = path.relative_to(PACKAGE_DIR).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                files[".".join(("localstate", *parts))] = path
    return files


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run on import, `if TYPE_CHECKING:` blocks (and every if/try) included;
    not the bodies of functions and classes' methods."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
            for handler in getattr(node, "handlers", []):
                yield from _top_level(handler.body)
            yield from _top_level(getattr(node, "finalbody", []))
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in _top_level(node.body) if not isinstance(n, ast.FunctionDef))


def import_graph(*, deferred: bool) -> dict[str, set[str]]:
    """Module -> the modules of localstate (and localstate.sync) it imports. `deferred`: the
    imports inside functions too."""
    files = module_files()

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes = ast.walk(tree) if deferred else _top_level(tree.body)
        targets: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                targets.update(filter(None, (known(a.name) for a in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    package = module.split(".")
                    if path.name != "__init__.py":
                        package = package[:-1]
                    package = package[:len(package) - node.level + 1]
                    base = ".".join([*package, *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in files else known(base)
                    if target is not None:
                        targets.add(target)
        targets.discard(module)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_type_checking_and_relative_imports() -> None:
    graph = import_graph(deferred=False)
    assert "localstate.store" in graph["localstate"]  # an `if TYPE_CHECKING:` import
    assert "localstate.entry_table" in graph["localstate.store_core"]
    assert "localstate.sync.worker" in graph["localstate.store"]  # `localstate.sync` is read
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_type_checking_imports_included() -> None:
    assert circles(import_graph(deferred=False)) == []


def test_the_only_circle_through_imports_made_on_use_is_the_declared_one() -> None:
    graph = import_graph(deferred=True)
    for module, target in DEFERRED_ON_PURPOSE:
        graph[module].discard(target)
    assert circles(graph) == []


def test_sync_imports_only_the_lower_layers_of_localstate() -> None:
    graph = import_graph(deferred=True)
    upward = {m: sorted(t for t in targets
                        if not t.startswith("localstate.sync") and t not in SYNC_MAY_IMPORT)
              for m, targets in graph.items() if m.startswith("localstate.sync")}
    assert {m: t for m, t in upward.items() if t} == {}
