"""No private name is reached across files: the store is one class, and each part it keeps in a
file of its own is used through public methods.

A private reach is an attribute access ``x._name`` (not a dunder) where ``_name`` is not defined
in the file that makes the access: ``self._name`` inherited from a class of another file, or
``obj._name`` of an object whose class lives elsewhere. It is read from the source (AST):

* ``self._name`` / ``cls._name`` / ``super()._name`` inside a class: `_name` must be defined by
  that class or by one of its bases defined in the same file (a method, a class attribute, or
  an assignment to ``self._name`` in one of its methods);
* any other ``obj._name``: `_name` must be defined by some class of the same file (the object
  is taken to be of that class), or by the file at module level.

The store's modules must have none; the rest of `localstate` and `localstate._sync` may not have
more than the counts recorded below (each is a debt to pay, not a licence).
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

import localstate
from localstate._testing.source_graph import module_files

ROOT = Path(localstate.__file__).resolve().parent.parent

#: the store: `StateStore` and the parts it keeps in files of their own
STORE_MODULES = (
    "localstate/_store.py", "localstate/_local_first.py", "localstate/_modes.py",
    "localstate/_mode_gate.py", "localstate/_pending_switch.py", "localstate/_core/reload.py",
    "localstate/_default_store.py", "localstate/_core/class_or_instance.py",
)

#: documented API of the standard library that happens to start with an underscore
STDLIB_PUBLIC = {"_exit", "_replace", "_asdict", "_fields", "_make", "_field_defaults"}

#: the private reaches outside the store, per file (may go down, never up)
KNOWN_ELSEWHERE: dict[str, int] = {
    # Airflow's own privates: its DB manager's lock hook, an Asset's name and URI
    "localstate/airflow/db_manager.py": 1,
    "localstate/airflow/trigger.py": 2,
}


@functools.cache
def _files() -> dict[str, Path]:
    """Every module's file (sync/ too), by its path in the repository."""
    return {path.relative_to(ROOT).as_posix(): path for path in sorted(module_files().values())}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in {"self", "cls"}
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "super")


def _class_defines(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target,
                                                                            ast.Name):
            names.add(node.target.id)
    for sub in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        while targets:
            t = targets.pop()
            if isinstance(t, ast.Tuple | ast.List):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute) and _is_self(t.value):
                names.add(t.attr)
    return names


def private_reaches(source: str, filename: str = "<source>") -> list[str]:
    """The cross-file private reaches of one file: ``"line: expr._name"`` each."""
    tree = ast.parse(source, filename)
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    defines = {name: _class_defines(c) for name, c in classes.items()}

    def lineage(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        cls = classes[name]
        names = set(defines[name])
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
                names |= lineage(base.id, seen | {name})
        return names

    module_level = {n.name for n in tree.body
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    for n in tree.body:
        if isinstance(n, ast.Assign):
            module_level.update(t.id for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            module_level.add(n.target.id)
    in_file = set().union(*defines.values(), module_level) if defines else module_level

    found: list[str] = []

    def visit(node: ast.AST, owner: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            owner = node.name
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and node.attr not in STDLIB_PUBLIC):
            if _is_self(node.value) and owner is not None:
                ok = node.attr in lineage(owner)
            else:
                ok = node.attr in in_file
            if not ok:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, owner)

    visit(tree, None)
    return found


@functools.cache
def all_reaches() -> dict[str, list[str]]:
    return {name: r for name, path in _files().items()
            if (r := private_reaches(path.read_text(), str(path)))}


def test_the_check_sees_an_inherited_private_and_a_foreign_one() -> None:
    # what the store looked like when it was spread over files: a subclass reading its base's
    # private state, and a caller reaching into another object
    source = (
        "from localstate.store_core import StoreCore\n"
        "class StateStore(StoreCore):\n"
        "    def get(self):\n"
        "        self._own = 1\n"
        "        return self._entries, self._own, self.table._entries, self._helper()\n"
        "    def _helper(self):\n"
        "        return super()._close()\n"
    )
    assert [r.split(": ")[1] for r in private_reaches(source)] == [
        "self._entries", "self.table._entries", "super()._close"]


def test_the_check_accepts_privates_of_the_same_file() -> None:
    source = (
        "class Base:\n"
        "    _flag = False\n"
        "    def __init__(self):\n"
        "        self._x, self._y = 1, 2\n"
        "class Store(Base):\n"
        "    def get(self, other: 'Base'):\n"
        "        return self._x + self._y + other._x + int(self._flag), self.__dict__\n"
    )
    assert private_reaches(source) == []


def test_the_store_modules_exist() -> None:
    files = _files()
    assert set(STORE_MODULES) <= set(files), set(STORE_MODULES) - set(files)


def test_the_store_reaches_no_private_name_across_files() -> None:
    reaches = all_reaches()
    assert {m: reaches[m] for m in STORE_MODULES if m in reaches} == {}


#: a file longer than this says at its top why it is one concept (CONTRIBUTING.md)
LONG_FILE = 600


def test_a_long_file_says_why_it_is_one_concept() -> None:
    unexplained = []
    for name, path in _files().items():
        source = path.read_text()
        if source.count("\n") <= LONG_FILE:
            continue
        doc = ast.get_docstring(ast.parse(source, str(path))) or ""
        if not any(p.startswith("Why one file") for p in doc.split("\n\n")):
            unexplained.append(name)
    assert unexplained == [], "begin a paragraph of the module docstring with 'Why one file'"


def test_the_store_is_a_long_file_that_says_why() -> None:
    # the check above has a file to check: the store is longer than the limit
    assert Path(localstate.__file__).with_name("_store.py").read_text().count("\n") > LONG_FILE


def test_private_reaches_elsewhere_do_not_grow() -> None:
    counts = Counter({m: len(r) for m, r in all_reaches().items() if m not in STORE_MODULES})
    grown = {m: (n, KNOWN_ELSEWHERE.get(m, 0)) for m, n in counts.items()
             if n > KNOWN_ELSEWHERE.get(m, 0)}
    assert grown == {}, "file: (private reaches now, allowed)"
