"""The folders are the layers, the import graph has no circle, and every module imports first.

A module's layer is the folder its file sits in: `localstate/errors/`, `localstate/_core/`
(the foundation), `localstate/_cache/` (the local cache), the top-level `sync/` folder
(installed as `localstate._sync`) with `central/`, `sinks/` and `flush/`, the store at the top
of `localstate/`, and the packages built on it. No table names them: the graph of folders, read
from every import (on load, under `if TYPE_CHECKING:` and inside functions alike), has no
cycle, so each import between two folders points one way, and the order it gives them is
checked against the architecture's. And every module imports first, in a fresh interpreter: no
import circle bites at run time, and the layers below the store do not load it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import localstate
import localstate._sync
from localstate._testing.source_graph import (
    circles,
    folder_graph,
    folder_layers,
    folder_of,
    import_graph,
    layer_map,
    module_files,
    statements_run_on_import,
)

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
    assert "localstate._core.conflicts" in modules
    assert "localstate._sync.flush.worker" in modules
    assert "localstate._store" in modules
    assert len(modules) > 60


#: run in a fresh interpreter: loads the third-party packages given, then imports each
#: localstate module first in a child forked from it (an interpreter per module, without paying
#: each time for SQLAlchemy, FastAPI or Airflow, which have no import order of localstate's);
#: prints, for each module, the error its import ended with ("" for none) and the modules of
#: localstate it loaded
_FORK_IMPORTER = r"""
import gc, importlib, json, os, sys, traceback
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
# the warm heap out of the collector's reach: a child's collections would otherwise walk it
# all, and copy every page of it on write (Airflow's heap is large)
gc.freeze()
found = {}
def start(module):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            error = ""
        except BaseException:
            error = traceback.format_exc().strip().splitlines()[-1] or "failed"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "localstate")
        os.write(write, json.dumps({"error": error, "loaded": loaded}).encode())
        os._exit(0)
    os.close(write)
    return pid, read
# a few children at a time: each writes a few kilobytes into its pipe (far below a pipe's
# buffer) and exits, so reading them in order never blocks one on another
for at in range(0, len(modules), 4):
    started = [(module, *start(module)) for module in modules[at:at + 4]]
    for module, pid, read in started:
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read().decode()
        _, status = os.waitpid(pid, 0)
        found[module] = json.loads(answer) if answer else {
            "error": f"exit status {status}", "loaded": []}
print(json.dumps(found))
"""


def import_each_first(modules: list[str], warm: list[str], cwd: Path) -> dict[str, Any]:
    """`_FORK_IMPORTER`'s answer: module -> {"error": ..., "loaded": [...]}."""
    result = subprocess.run([sys.executable, "-c", _FORK_IMPORTER],
                            input=json.dumps([modules, warm]), capture_output=True, text=True,
                            timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def first_imports() -> dict[str, Any]:
    """Every module imported first in an interpreter of its own (one run for the tests
    below)."""
    return import_each_first(all_modules(), third_party_imports(), PACKAGE_DIR.parent.parent)


def third_party_imports() -> list[str]:
    """The packages outside localstate that its modules import on load (sorted)."""
    names: set[str] = set()
    for path in module_files().values():
        for node in statements_run_on_import(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in {"localstate", "__future__"})


def test_every_module_imports_first_in_a_fresh_interpreter(
        first_imports: dict[str, Any]) -> None:
    """Every module imports first in an interpreter of its own; and each module below the
    store imports without loading it (`localstate/__init__.py` loads the store on first use
    only). One test for both: the imports are the suite's slowest structure check."""
    assert "sqlalchemy" in {n.split(".")[0] for n in third_party_imports()}
    assert set(first_imports) == set(all_modules())
    assert {m: a["error"] for m, a in first_imports.items() if a["error"]} == {}
    modules = lower_modules()
    assert "localstate._sync.flush.worker" in modules
    assert "localstate._core.codec" in modules
    assert "localstate._store" in first_imports["localstate._store"]["loaded"]  # it can tell
    assert [m for m in modules if "localstate._store" in first_imports[m]["loaded"]] == []


def test_the_fork_importer_reports_a_module_that_fails_to_import(tmp_path: Path) -> None:
    (tmp_path / "broken_first.py").write_text("import broken_second\n")
    (tmp_path / "broken_second.py").write_text("from broken_first import missing\n")
    found = import_each_first(["broken_first", "json"], ["orjson"], tmp_path)
    assert "ImportError" in found["broken_first"]["error"]
    assert found["json"]["error"] == ""


def test_there_is_no_top_level_sync_package() -> None:
    # as installed: not from the checkout (a PYTHONPATH naming it would put sync/ on the path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", "import sync"], capture_output=True,
                            text=True, cwd="/", timeout=60, env=env)
    assert result.returncode != 0
    assert "No module named 'sync'" in result.stderr


# -- the folders are the layers -------------------------------------------------------------
#
# A module's layer is its folder: nothing here names a module's layer by hand. A folder's
# place among the layers is read from the import graph (`localstate._testing.source_graph`:
# one above the highest folder it imports from), so the graph of folders must have no cycle:
# an import between two folders points one way, and a new module joins its folder's layer by
# being put in the folder.

#: the most private modules directly in localstate/ (the store and its modes): the rest sit in
#: the folder of their layer
MAX_TOP_MODULES = 12


def test_the_graph_sees_type_checking_relative_and_function_local_imports() -> None:
    graph = import_graph(deferred=False)
    assert "localstate._store" in graph["localstate"]  # an `if TYPE_CHECKING:` import
    assert "localstate._cache.entry_table" in graph["localstate._store"]
    # sync/ is read too, under its installed name
    assert "localstate._cache.entry_table" in graph["localstate._sync.flush.worker"]
    assert any(t.startswith("localstate._sync.") for t in graph["localstate._store"])
    # an import made inside a function, on use (the REST sink needs httpx, an extra)
    assert "localstate._sync.sinks.api_sink" not in graph["localstate._store"]
    assert "localstate._sync.sinks.api_sink" in import_graph(deferred=True)["localstate._store"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_type_checking_imports_included() -> None:
    assert circles(import_graph(deferred=False)) == []


def test_no_import_circle_function_local_imports_included() -> None:
    """No circle closed by importing inside a function either: each is a layering bug."""
    assert circles(import_graph(deferred=True)) == []


def test_the_folder_of_a_module() -> None:
    assert folder_of("localstate._sync.flush.worker") == "localstate._sync.flush"
    assert folder_of("localstate._sync.flush") == "localstate._sync.flush"
    assert folder_of("localstate._store") == "localstate"
    assert folder_of("localstate") == "localstate"
    assert folder_of("localstate.errors") == "localstate.errors"  # a package of its own


@pytest.mark.parametrize("deferred", [False, True])
def test_imports_between_folders_point_one_way(deferred: bool) -> None:
    """The folders' graph has no cycle, function-local and `if TYPE_CHECKING:` imports
    included: each folder is a layer, and imports only go down."""
    assert circles(folder_graph(deferred=deferred)) == []


def test_the_layers_are_those_of_the_architecture() -> None:
    """The order the import graph gives the folders is the architecture's (docs/architecture.md
    draws it): the exception tree, the foundation, the local cache, the central DB, the sinks,
    the flush, the store at the top of localstate/, then what is built on the store."""
    layer = folder_layers()
    chain = ["localstate.errors", "localstate._core", "localstate._cache",
             "localstate._sync.central", "localstate._sync.sinks", "localstate._sync.flush",
             "localstate"]
    assert [layer[f] for f in chain] == sorted(layer[f] for f in chain), layer_map()
    assert len({layer[f] for f in chain}) == len(chain), layer_map()
    for front in ("localstate.api", "localstate.cli", "localstate.airflow"):
        assert layer[front] > layer["localstate"], layer_map()


def test_the_top_of_the_package_holds_the_store_and_the_public_modules() -> None:
    from test_exported_members import PUBLIC_MODULES

    top = sorted(m for m in module_files() if folder_of(m) == "localstate"
                 and m not in PUBLIC_MODULES)
    assert 0 < len(top) <= MAX_TOP_MODULES, top
    assert "localstate._store" in top


def test_sync_holds_the_layers_above_the_local_cache() -> None:
    """sync/ (`localstate._sync`) is the central DB, the sinks and the flush, each a folder;
    nothing outside sync/ below the store imports it."""
    layer = folder_layers()
    in_sync = {f for f in layer if f.startswith("localstate._sync.")}
    assert in_sync == {"localstate._sync.central", "localstate._sync.sinks",
                       "localstate._sync.flush"}
    lowest = min(layer[f] for f in in_sync)
    graph = folder_graph(deferred=True)
    below = {f: sorted(t for t in graph[f] if t.startswith("localstate._sync"))
             for f in layer if layer[f] < lowest}
    assert {f: t for f, t in below.items() if t} == {}, layer_map()


def lower_modules() -> list[str]:
    """The modules of the folders below the store's (the top of localstate/)."""
    layer = folder_layers()
    return sorted(m for m in all_modules() if layer[folder_of(m)] < layer["localstate"])
