#!/usr/bin/env python3
"""Move modules between the layers' folders, and rewrite every mention of their old names.

    python scripts/rewrite_imports.py --mv        run the `git mv` of each move still to do
    python scripts/rewrite_imports.py [PATH ...]  rewrite the mentions (default: the checkout)
    python scripts/rewrite_imports.py --symbols [PATH ...]  import re-exported names from home

`MOVES` maps an old dotted module name to its new one. ``localstate.sync`` is the top-level
``sync/`` folder (``localstate.sync.rows`` is the file ``sync/rows.py``), every other
``localstate.x`` is ``localstate/x.py``. The rewrite changes, in every ``.py``, ``.md``,
``.yml``, ``.toml`` and ``.cfg`` file under localstate/, sync/, tests/, benches/, scripts/
and docs/ (and the top-level files):

* the dotted name, whole names only (``localstate.sync.rows`` -> ``localstate.rows``;
  ``localstate.sync.rows_x`` is left alone);
* ``from localstate.sync import rows`` (a module imported from its package);
* the file's path (``sync/rows.py``, ``localstate/sync/rows.py``).

`SYMBOL_MOVES` maps a name imported from a module that only re-exported it (or an alias of it)
to the module that defines it (and its own name): ``from localstate.config import ApiToken``
becomes ``from localstate.setting_specs import ApiToken``; a renamed name is renamed in the
importing file too. Run with ``--symbols`` (Python files only).

Both steps are idempotent: re-run them after merging a branch that added a module at an old
place or new mentions of an old name. CHANGELOG.md is left alone (it names the old places on
purpose).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: old dotted name -> new dotted name
MOVES: dict[str, str] = {
    # the foundation: types and helpers the local layer and sync's layers share, below sync
    "localstate.sync.rows": "localstate.rows",
    "localstate.sync.conflicts": "localstate.conflicts",
    "localstate.sync.orders": "localstate.orders",
    "localstate.sync.retention_rules": "localstate.retention_rules",
    "localstate.sync.futures": "localstate.futures",
    "localstate.sync.backoff": "localstate.backoff",
    "localstate.sync.lanes": "localstate.lanes",
    "localstate.sync.failure_log": "localstate.failure_log",
    # the HTTP boundary's wire format, which the server, the client and the API sink share
    "localstate.sync.wire": "localstate.protocol",
    # the claim epochs a flush is fenced with: the flush layer, beside the worker
    "localstate.claims": "localstate.sync.claims",
}

#: (module, name) -> (module, name): a name imported from a module that re-exported it (or an
#: alias of it), imported from where it is defined instead
SYMBOL_MOVES: dict[tuple[str, str], tuple[str, str]] = {
    # re-exports left by earlier splits
    **{("localstate.config", name): ("localstate.setting_specs", name) for name in (
        "API_ROLES", "DEFAULTS", "LIVE_SETTINGS", "SETTING_NAMES", "ApiToken", "setting_specs")},
    **{("localstate.local_cache", name): ("localstate.cache_file", name) for name in (
        "APPLICATION_ID", "SCHEMA", "SCHEMA_VERSION", "UPSERT")},
    ("localstate.sync.airflow_sink", "AssetBatchReader"):
        ("localstate.sync.asset_batch_reads", "AssetBatchReader"),
    ("localstate.sync.worker", "FlushReport"): ("localstate.sync.settle", "FlushReport"),
    ("localstate.sync.worker", "ConflictInfo"): ("localstate.sync.settle", "ConflictInfo"),
    **{("localstate.testing.postgres_server", name): ("localstate.testing.postgres_binaries",
                                                      name)
       for name in ("PostgresBinaries", "find_postgres_binaries")},
    # an alias: a fleet row read back is a FleetStatus
    ("localstate.sync.fleet", "FleetRow"): ("localstate.sync.fleet", "FleetStatus"),
    # the HTTP error table moved out of the user-facing client, into the protocol module
    ("localstate.client", "error_for"): ("localstate.protocol", "error_for"),
    # the largest version, defined once (it was defined three times)
    ("localstate.sync.cas_write", "MAX_VERSION"): ("localstate.model", "MAX_VERSION"),
    ("localstate.api.schemas", "MAX_VERSION"): ("localstate.model", "MAX_VERSION"),
}

#: the folders (and top-level files) the rewrite reads
DIRS = ("localstate", "sync", "tests", "benches", "scripts", "docs")
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".cfg", ".txt"}
SKIP = {".venv", "build", ".git", ".mypy_cache", ".ruff_cache", ".pytest_cache", "site",
        "__pycache__", ".hypothesis"}
#: files that name the old places on purpose
SKIP_FILES = {"CHANGELOG.md"}


def path_of(module: str) -> str:
    """The file of a dotted module name, relative to the checkout."""
    parts = module.split(".")
    if parts[:2] == ["localstate", "sync"]:
        return "/".join(["sync", *parts[2:]]) + ".py"
    return "/".join(parts) + ".py"


def _rules() -> list[tuple[re.Pattern[str], str]]:
    rules: list[tuple[re.Pattern[str], str]] = []
    for old, new in MOVES.items():
        old_package, _, old_name = old.rpartition(".")
        new_package, _, new_name = new.rpartition(".")
        # `from localstate.sync import rows` (alone on its line: a list names others too)
        rules.append((re.compile(rf"^(\s*)from {re.escape(old_package)} import "
                                 rf"{re.escape(old_name)}\b(?!,)", re.M),
                      rf"\1from {new_package} import {new_name}"))
        rules.append((re.compile(r"(?<![\w.])" + re.escape(old) + r"(?!\w)"), new))
        # the path, also as an earlier layout spelled it (through its localstate/sync link)
        old_path, new_path = path_of(old), path_of(new)
        spellings = [old_path] + (["localstate/" + old_path] if old_path.startswith("sync/")
                                  else [])
        for spelled in spellings:
            rules.append((re.compile(r"(?<![\w/.])" + re.escape(spelled) + r"(?!\w)"),
                          new_path))
    return rules


RULES = _rules()


def rewrite(text: str) -> str:
    for pattern, replacement in RULES:
        text = pattern.sub(replacement, text)
    return text


def files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_file():
            found.append(path)
            continue
        for candidate in sorted(path.rglob("*")):
            if candidate.resolve() != candidate or not candidate.is_file():
                continue  # a tree of the earlier layout: read sync/ once, not through its link
            parts = set(candidate.relative_to(path).parts)
            if (candidate.suffix in SUFFIXES and not parts & SKIP
                    and candidate.name not in SKIP_FILES):
                found.append(candidate)
    return found


def default_paths() -> list[Path]:
    top = [p for p in ROOT.iterdir()
           if p.is_file() and p.suffix in SUFFIXES and p.name not in SKIP_FILES]
    return sorted(top) + [ROOT / d for d in DIRS if (ROOT / d).is_dir()]


def git_mv() -> list[str]:
    """`git mv` each module whose old file is still there; the commands run."""
    done: list[str] = []
    for old, new in MOVES.items():
        source, target = ROOT / path_of(old), ROOT / path_of(new)
        if source.exists() and not target.exists():
            command = ["git", "mv", path_of(old), path_of(new)]
            subprocess.run(command, cwd=ROOT, check=True)
            done.append(" ".join(command))
    return done


def move_symbols(text: str) -> str:
    """`SYMBOL_MOVES` applied to the ``from module import ...`` statements of Python source
    (a renamed name renamed in the whole file)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    renames: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
            continue
        if not any((node.module, a.name) in SYMBOL_MOVES for a in node.names):
            continue
        by_module: dict[str, list[str]] = {}
        for alias in node.names:
            module, name = SYMBOL_MOVES.get((node.module, alias.name), (node.module, alias.name))
            if name != alias.name and alias.asname is None:
                renames[alias.name] = name
            spelled = name if alias.asname is None else f"{name} as {alias.asname}"
            if spelled not in by_module.setdefault(module, []):
                by_module[module].append(spelled)
        indent = " " * node.col_offset
        new = "".join(_from_import(indent, module, names) for module, names in by_module.items())
        assert node.end_lineno is not None
        edits.append((node.lineno - 1, node.end_lineno, new))
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start:end] = [replacement]
    text = "".join(lines)
    for old, new_name in renames.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new_name, text)
    return text


def _from_import(indent: str, module: str, names: list[str]) -> str:
    line = f"{indent}from {module} import {', '.join(names)}\n"
    if len(line) <= 100:
        return line
    body = "".join(f"{indent}    {name},\n" for name in names)
    return f"{indent}from {module} import (\n{body}{indent})\n"


def main(argv: list[str]) -> int:
    if argv == ["--mv"]:
        print("\n".join(git_mv()) or "nothing to move")
        return 0
    symbols = argv[:1] == ["--symbols"]
    argv = argv[1:] if symbols else argv
    changed: list[Path] = []
    for path in files([Path(a).resolve() for a in argv] or default_paths()):
        if path == Path(__file__).resolve() or (symbols and path.suffix != ".py"):
            continue
        text = path.read_text()
        new = move_symbols(text) if symbols else rewrite(text)
        if new != text:
            path.write_text(new)
            changed.append(path)
            print(path.relative_to(ROOT) if ROOT in path.parents else path)
    sort_imports([p for p in changed if p.suffix == ".py"])
    return 0


def sort_imports(paths: list[Path]) -> None:
    """The renamed imports back in ruff's order (isort rules only: nothing else changes)."""
    if not paths:
        return
    ruff = Path(sys.executable).with_name("ruff")
    command = [str(ruff) if ruff.exists() else "ruff", "check", "--fix", "--select", "I",
               "--quiet", *map(str, paths)]
    subprocess.run(command, cwd=ROOT, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
