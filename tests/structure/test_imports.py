"""The import graph has layers (`LAYERS`, lowest first) and no circle.

Every module of `localstate` and `localstate._sync` has one layer, and imports only its own
layer and lower ones: on load, under `if TYPE_CHECKING:` and inside functions alike. The
folder is the layer: the top-level `sync/` folder (installed as `localstate._sync`) holds
exactly the central, sinks and flush layers, so nothing below it imports it. And every module
imports first, in a fresh interpreter: no import circle bites at run time, and the lower layers
do not load the store.
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
import localstate._sync

PACKAGE_DIR = Path(localstate.__file__).resolve().parent
#: the top-level sync/ folder, which installs as the subpackage localstate._sync
SYNC_DIR = Path(localstate._sync.__file__).resolve().parent


def all_modules() -> list[str]:
    """The modules to import: every one but `__main__`s and Alembic's env script (which runs
    only inside Alembic's context)."""
    return [name for name, path in module_files().items()
            if path.stem != "__main__" and path.parts[-2:] != ("_migrations", "env.py")]


def import_first(module: str, check: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import importlib, sys; importlib.import_module({module!r}); {check}"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=PACKAGE_DIR.parent.parent)


def test_the_modules_include_sync_and_the_store() -> None:
    modules = all_modules()
    assert "localstate._conflicts" in modules
    assert "localstate._sync.worker" in modules
    assert "localstate._store" in modules
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
    "localstate.errors", "localstate._codec", "localstate._model", "localstate._entry",
    "localstate._local_cache", "localstate._config", "localstate._conflicts",
    "localstate._sync.central_store", "localstate._sync.worker",
])
def test_a_lower_layer_does_not_load_the_store(module: str) -> None:
    result = import_first(module, "assert 'localstate._store' not in sys.modules, "
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

#: The layers, lowest first (docs/architecture.md describes them). A module imports only
#: modules of its own layer or of lower ones, on load or on use. Each module has exactly one
#: layer: its exact name, or a package's name with ".*" for the package and every module
#: under it. The central, sinks and flush layers are exactly the modules of `localstate._sync`
#: (`SYNC_LAYERS`).
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {
        "localstate.errors", "localstate._version", "localstate._model", "localstate._codec",
        "localstate._rows", "localstate._entry", "localstate._orders", "localstate._conflicts",
        "localstate._retention_rules", "localstate._setting_specs", "localstate._config",
        "localstate._reload", "localstate._file_lock", "localstate._futures", "localstate._backoff",
        "localstate._lanes", "localstate._failure_log", "localstate._protocol",
        "localstate._class_or_instance", "localstate._api_connection", "localstate._body_slices",
    }),
    ("local", {
        "localstate._absent_keys", "localstate._owner_index", "localstate._eviction",
        "localstate._entry_table", "localstate._cache_file", "localstate._cache_compaction",
        "localstate._local_cache", "localstate._outbox", "localstate._mode_gate",
        "localstate._left_open",
    }),
    ("central", {
        "localstate._sync", "localstate._sync.schema", "localstate._sync.fleet",
        "localstate._sync.dialects", "localstate._sync.driver_errors", "localstate._sync.engine",
        "localstate._sync.asset_mirror", "localstate._sync.asset_events",
        "localstate._sync.history", "localstate._sync.fenced_write",
        "localstate._sync.cas_write", "localstate._sync.central_store",
        "localstate._sync.retention",
    }),
    ("sinks", {
        "localstate._sync.sinks", "localstate._sync.sink_thread", "localstate._sync.read_through",
        "localstate._sync.api_sink", "localstate._sync.airflow_sink",
        "localstate._sync.asset_batch_reads", "localstate._sync.asset_states",
    }),
    ("flush", {
        "localstate._sync.claims", "localstate._sync.budget", "localstate._sync.waiters",
        "localstate._sync.settle", "localstate._sync.worker",
    }),
    ("store", {
        "localstate._pending_switch", "localstate._stats", "localstate._metrics",
        "localstate._modes", "localstate._local_first", "localstate._store",
        "localstate._default_store", "localstate.blocking",
    }),
    ("front", {
        "localstate", "localstate.client", "localstate.api.*", "localstate.cli.*",
        "localstate.airflow.*", "localstate._bench.*", "localstate.examples.*",
        "localstate._testing.*",
    }),
]
#: the layers the folder sync/ (`localstate._sync`) holds, and nothing else does
SYNC_LAYERS = {"central", "sinks", "flush"}


def layer_of(module: str) -> int:
    """The index in `LAYERS` of `module`'s layer (KeyError: it has none). An exact name wins
    over a package's ".*"; the closest package wins over one further up."""
    for index, (_layer, members) in enumerate(LAYERS):
        if module in members:
            return index
    name = module
    while name:
        for index, (_layer, members) in enumerate(LAYERS):
            if f"{name}.*" in members:
                return index
        name = name.rpartition(".")[0]
    raise KeyError(module)


def layer_name(module: str) -> str:
    return LAYERS[layer_of(module)][0]


def module_files() -> dict[str, Path]:
    """Each module of localstate (sync/ as `localstate._sync`, its installed name) and its file."""
    files = {}
    for package, folder in (("localstate", PACKAGE_DIR), ("localstate._sync", SYNC_DIR)):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((package, *parts))] = path
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
    """Module -> the modules of localstate (and localstate._sync) it imports. `deferred`: the
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


def test_the_graph_sees_type_checking_relative_and_function_local_imports() -> None:
    graph = import_graph(deferred=False)
    assert "localstate._store" in graph["localstate"]  # an `if TYPE_CHECKING:` import
    assert "localstate._entry_table" in graph["localstate._store"]
    assert "localstate._entry_table" in graph["localstate._sync.worker"]  # sync/ is read too
    assert any(t.startswith("localstate._sync.") for t in graph["localstate._store"])
    # an import made inside a function, on use (the REST sink needs httpx, an extra)
    assert "localstate._sync.api_sink" not in graph["localstate._store"]
    assert "localstate._sync.api_sink" in import_graph(deferred=True)["localstate._store"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_type_checking_imports_included() -> None:
    assert circles(import_graph(deferred=False)) == []


def test_no_import_circle_function_local_imports_included() -> None:
    """No circle closed by importing inside a function either: each is a layering bug."""
    assert circles(import_graph(deferred=True)) == []


def test_every_module_has_one_layer() -> None:
    modules = set(module_files())
    missing = sorted(m for m in modules if _layer_or_none(m) is None)
    assert missing == [], f"add these modules to LAYERS: {missing}"
    named = [m for _layer, members in LAYERS for m in members]
    assert len(named) == len(set(named)), "a module is in two layers"
    stale = sorted(m for m in named if m.removesuffix(".*") not in modules)
    assert stale == [], f"LAYERS names modules that do not exist: {stale}"


def _layer_or_none(module: str) -> int | None:
    try:
        return layer_of(module)
    except KeyError:
        return None


def test_imports_point_down_the_layers() -> None:
    """Imports on load and on use (`if TYPE_CHECKING:` ones included) go to the importer's own
    layer or a lower one."""
    upward = sorted(
        f"{module} ({layer_name(module)}) -> {target} ({layer_name(target)})"
        for module, targets in import_graph(deferred=True).items() for target in targets
        if layer_of(target) > layer_of(module))
    assert upward == []


def test_the_folder_is_the_layer() -> None:
    """sync/ holds exactly the central, sinks and flush layers; the layers are in order."""
    names = [name for name, _members in LAYERS]
    assert len(names) == len(set(names))
    in_sync = {m: layer_name(m) for m in module_files() if m.startswith("localstate._sync")}
    assert {m: layer for m, layer in in_sync.items() if layer not in SYNC_LAYERS} == {}
    outside = {m: layer_name(m) for m in module_files() if not m.startswith("localstate._sync")}
    assert {m: layer for m, layer in outside.items() if layer in SYNC_LAYERS} == {}
    sync_at = sorted(names.index(layer) for layer in SYNC_LAYERS)
    assert sync_at == list(range(sync_at[0], sync_at[0] + len(sync_at))), "sync's layers adjoin"


def test_the_layer_table_places_modules() -> None:
    assert layer_name("localstate._sync.central_store") == "central"
    assert layer_name("localstate._sync.worker") == "flush"
    assert layer_name("localstate.api._routes") == layer_name("localstate") == "front"
    assert layer_of("localstate._rows") < layer_of("localstate._sync.sinks")
    with pytest.raises(KeyError):
        layer_of("localstate.nowhere")


def test_nothing_below_sync_imports_sync() -> None:
    lowest = min(layer_of(m) for m in module_files() if m.startswith("localstate._sync"))
    below = {m: sorted(t for t in targets if t.startswith("localstate._sync"))
             for m, targets in import_graph(deferred=True).items() if layer_of(m) < lowest}
    assert {m: t for m, t in below.items() if t} == {}
