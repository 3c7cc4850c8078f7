"""The import graph of localstate's source, read with `ast`: modules, folders and their layers.

The structure tests check it (no cycle between modules or folders, the layers in the
architecture's order) and the documentation's build draws the module map from it, so both read
the layers from the same place: the folders themselves. Nothing is imported to build it; the
files are parsed. A folder's layer is one above the highest folder it imports from, on load
(`if TYPE_CHECKING:` blocks included) or inside a function.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "circles",
    "folder_graph",
    "folder_layers",
    "folder_of",
    "import_graph",
    "layer_map",
    "module_files",
    "package_folder",
    "statements_run_on_import",
    "summary",
]


def package_folder(package: str) -> Path:
    """The folder an installed package's files are in (`localstate._sync` is sync/)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(package)
    return Path(spec.origin).resolve().parent


PACKAGE_DIR = package_folder("localstate")
#: the top-level sync/ folder, which installs as the subpackage localstate._sync
SYNC_DIR = package_folder("localstate._sync")


@functools.cache
def module_files() -> dict[str, Path]:
    """Each module of localstate (sync/ as `localstate._sync`, its installed name) and its file."""
    files: dict[str, Path] = {}
    for package, folder in (("localstate", PACKAGE_DIR), ("localstate._sync", SYNC_DIR)):
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((package, *parts))] = path
    return files


def statements_run_on_import(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run on import, `if TYPE_CHECKING:` blocks (and every if/try) included;
    not the bodies of functions and classes' methods."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from statements_run_on_import(node.body)
            yield from statements_run_on_import(node.orelse)
            for handler in getattr(node, "handlers", []):
                yield from statements_run_on_import(handler.body)
            yield from statements_run_on_import(getattr(node, "finalbody", []))
        elif isinstance(node, ast.ClassDef):
            yield from (n for n in statements_run_on_import(node.body)
                        if not isinstance(n, ast.FunctionDef))


@functools.cache
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
        nodes = ast.walk(tree) if deferred else statements_run_on_import(tree.body)
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


def folder_of(module: str) -> str:
    """The folder a module's file sits in, as the dotted name of its package (a package's
    `__init__` is in its own folder)."""
    path = module_files()[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def folder_graph(*, deferred: bool) -> dict[str, set[str]]:
    """Folder -> the other folders its modules import."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(deferred=deferred).items():
        graph.setdefault(folder_of(module), set()).update(
            folder_of(t) for t in targets if folder_of(t) != folder_of(module))
    return graph


@functools.cache
def folder_layers() -> dict[str, int]:
    """Each folder's layer, 0 the lowest: one above the highest of the folders it imports (on
    load or on use). Only for a graph without a cycle."""
    graph = folder_graph(deferred=True)
    layer: dict[str, int] = {}

    def place(folder: str) -> int:
        if folder not in layer:
            layer[folder] = 1 + max((place(t) for t in graph[folder]), default=-1)
        return layer[folder]

    for folder in graph:
        place(folder)
    return layer


def layer_map() -> str:
    """The folders by layer, lowest first: what a failure prints."""
    by_layer: dict[int, list[str]] = {}
    for folder, layer in folder_layers().items():
        by_layer.setdefault(layer, []).append(folder)
    return "\n".join(f"{n}: {', '.join(sorted(f))}" for n, f in sorted(by_layer.items()))




def summary(module: str) -> str:
    """The first sentence of a module's docstring: what the module is ("" without one)."""
    tree = ast.parse(module_files()[module].read_text())
    paragraph = (ast.get_docstring(tree) or "").strip().split("\n\n")[0]
    text = " ".join(line.strip() for line in paragraph.splitlines())
    end = text.find(". ")
    return text if end == -1 else text[:end + 1]
