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

`PRIVATE_MODULES` and `PRIVATE_PACKAGES` then give every module that is not public a private
name (httpx's layout: the public modules, listed in tests/test_exported_members.py, keep their
names; the rest get a leading ``_``): ``localstate.store`` -> ``localstate._store``,
``localstate.bench`` -> ``localstate._bench`` (its files keep their names inside it), and
``localstate.sync`` -> ``localstate._sync`` (still the top-level ``sync/`` folder, mapped by
pyproject's ``package-dir``: only the dotted name changes). ``--mv`` moves those files too, and
the rewrite applies both tables, the moves first. Two kinds of names must not follow a module's:

* logger names, which operators configure: each ``getLogger(__name__)`` of localstate and sync/
  becomes ``getLogger("<the module's public-era name>")`` (``localstate.store``), and a bare
  dotted name on a line about logs or metrics (``getLogger(``, ``logger=``, ``.name ==``,
  ``statsd.``, the words log, logs, logger, loggers, rate) is left as it is (the logger
  ``localstate.conflicts`` is a metric too); a name with a class after it is still rewritten;
* the previous release's code in tests/upgrade/ (`SKIP_PATHS`), which imports its own names.

Both steps are idempotent: re-run them after merging a branch that added a module at an old
place or new mentions of an old name. CHANGELOG.md is left alone (it names the old places on
purpose).

    python scripts/rewrite_imports.py --mv && python scripts/rewrite_imports.py
"""

from __future__ import annotations

import ast
import functools
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

#: the internal modules of the public packages (localstate, localstate.api, localstate.airflow):
#: private by name; localstate.cli's were named so from the start
PRIVATE_MODULES: dict[str, str] = {
    f"{package}.{name}": f"{package}._{name}"
    for package, names in (
        ("localstate", (
            "absent_keys", "backoff", "cache_compaction", "cache_file", "class_or_instance",
            "codec", "config", "conflicts", "default_store", "entry", "entry_table",
            "eviction", "failure_log", "file_lock", "futures", "lanes", "local_cache",
            "local_first", "metrics", "mode_gate", "model", "modes", "orders", "outbox",
            "owner_index", "pending_switch", "protocol", "reload", "retention_rules", "rows",
            "setting_specs", "stats", "store", "version")),
        ("localstate.api", (
            "app", "auth", "context", "csrf", "errors", "paths", "routes", "schemas",
            "serve_token", "sink_routes", "ui", "view")),
        ("localstate.airflow", ("auth", "mount", "runner_gc", "serving", "shutdown")),
    )
    for name in names
}

#: internal packages: private by name, their modules keep their names inside them
PRIVATE_PACKAGES: dict[str, str] = {
    "localstate.sync": "localstate._sync",  # the top-level sync/ folder, renamed by mapping
    "localstate.bench": "localstate._bench",
    "localstate.testing": "localstate._testing",
    "localstate.airflow.migrations": "localstate.airflow._migrations",
}

PRIVATE: dict[str, str] = {**PRIVATE_MODULES, **PRIVATE_PACKAGES}

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
#: files that name the old places on purpose (the changelog; the script's own test)
SKIP_FILES = {"CHANGELOG.md", "test_rewrite_imports.py"}
#: folders (relative to the checkout) of code that runs under another release's names
SKIP_PATHS = ("tests/upgrade/",)
#: a line about logs or metrics: a bare dotted name there is a logger's or a metric's
STABLE_CONTEXT = re.compile(r"getLogger\(|\blogger\s*=|\.name\s*==|statsd\.|"
                            r"\b(?:log|logs|logger|loggers|rate)\b")


def folder_of(module: str) -> str:
    """The folder (or file, without its suffix) of a dotted name, relative to the checkout."""
    parts = module.split(".")
    if parts[:2] in (["localstate", "sync"], ["localstate", "_sync"]):
        return "/".join(["sync", *parts[2:]])
    return "/".join(parts)


def path_of(module: str) -> str:
    """The file of a dotted module name, relative to the checkout."""
    return folder_of(module) + ".py"


def module_of(path: Path) -> str | None:
    """The dotted name of a file of localstate/ or sync/ (None elsewhere)."""
    if ROOT not in path.resolve().parents:
        return None
    relative = path.resolve().relative_to(ROOT).with_suffix("").parts
    if relative[:1] == ("sync",):
        relative = ("localstate", "_sync", *relative[1:])
    elif relative[:1] != ("localstate",):
        return None
    if relative[-1] == "__init__":
        relative = relative[:-1]
    return ".".join(relative)


def public_era_name(module: str) -> str:
    """The name a module had before the privacy renames (what its logger is called)."""
    for old, new in sorted(PRIVATE.items(), key=lambda item: -len(item[1])):
        if module == new or module.startswith(new + "."):
            return old + module[len(new):]
    return module


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


def _private_rules() -> list[tuple[re.Pattern[str], str]]:
    rules: list[tuple[re.Pattern[str], str]] = []
    for old, new in PRIVATE.items():
        old_package, _, old_name = old.rpartition(".")
        # `from localstate.airflow import shutdown`: imported as a module, under its local name
        # (`import localstate.airflow._shutdown as shutdown`: a private module, not a private
        # name of its package)
        importing = rf"^(\s*)from {re.escape(old_package)} import {re.escape(old_name)}\b"
        rules.append((re.compile(importing + r"(?=\s+as\b)", re.M), rf"\1import {new}"))
        rules.append((re.compile(importing + r"(?!,|\s+as\b)", re.M),
                      rf"\1import {new} as {old_name}"))
        old_path, new_path = folder_of(old), folder_of(new)
        if old_path == new_path:
            continue  # localstate.sync: the folder stays sync/
        if old in PRIVATE_PACKAGES:  # the folder, followed by one of its files
            rules.append((re.compile(r"(?<![\w/.])" + re.escape(old_path) + r"(?=/)"),
                          new_path))
        else:
            rules.append((re.compile(r"(?<![\w/.])" + re.escape(old_path + ".py") + r"(?!\w)"),
                          new_path + ".py"))
    return rules


RULES = _rules()
PRIVATE_RULES = _private_rules()
#: an old dotted name, whole, and what follows it (`localstate.sync`, `localstate.sync.worker`,
#: `localstate.store.StateStore`)
PRIVATE_NAME = re.compile(r"(?<![\w.])(" + "|".join(
    re.escape(old) for old in sorted(PRIVATE, key=len, reverse=True)) + r")(?!\w)((?:\.\w+)*)")


def _private_name(match: re.Match[str], line: str) -> str:
    old, rest = match.group(1), match.group(2)
    if STABLE_CONTEXT.search(line) and not re.search(r"\.[A-Z]", rest):
        return match.group(0)  # a logger's or a metric's name (no class in it), not a module's
    return PRIVATE[old] + rest


def explicit_loggers(text: str, module: str) -> str:
    """``getLogger(__name__)`` named: the logger keeps the module's public-era name."""
    return text.replace("getLogger(__name__)", f'getLogger("{public_era_name(module)}")')


def rewrite(text: str, module: str | None = None) -> str:
    for pattern, replacement in RULES:
        text = pattern.sub(replacement, text)
    if module is not None:
        text = explicit_loggers(text, module)
    text = "".join(PRIVATE_NAME.sub(functools.partial(_private_name, line=line), line)
                   for line in text.splitlines(keepends=True))
    for pattern, replacement in PRIVATE_RULES:
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
                    and candidate.name not in SKIP_FILES and not _skipped(candidate)):
                found.append(candidate)
    return found


def _skipped(path: Path) -> bool:
    if ROOT not in path.resolve().parents:
        return False
    return path.resolve().relative_to(ROOT).as_posix().startswith(SKIP_PATHS)


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
    for old, new in PRIVATE.items():
        folder, renamed = folder_of(old), folder_of(new)
        if folder == renamed:
            continue
        if old in PRIVATE_MODULES:
            moves = [(folder + ".py", renamed + ".py")]
        elif not (ROOT / renamed).exists():
            moves = [(folder, renamed)]  # the whole package
        else:  # a file a merged branch added to the package at its old place
            listed = subprocess.run(["git", "ls-files", "--", folder], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout.split()
            moves = [(f, renamed + f[len(folder):]) for f in listed]
        for source_file, target_file in moves:
            if (ROOT / source_file).exists() and not (ROOT / target_file).exists():
                command = ["git", "mv", source_file, target_file]
                subprocess.run(command, cwd=ROOT, check=True)
                done.append(" ".join(command))
            elif (ROOT / source_file).exists():
                print(f"both {source_file} and {target_file} exist: merge them by hand",
                      file=sys.stderr)
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
        new = move_symbols(text) if symbols else rewrite(
            text, module_of(path) if path.suffix == ".py" else None)
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
