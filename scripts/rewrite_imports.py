#!/usr/bin/env python3
"""Move modules between the layers' folders, and rewrite every mention of their old names.

    python scripts/rewrite_imports.py --mv        run the `git mv` of each move still to do
    python scripts/rewrite_imports.py [PATH ...]  rewrite the mentions (default: the checkout)

`MOVES` maps an old dotted module name to its new one. ``localstate.sync`` is the top-level
``sync/`` folder (``localstate.sync.rows`` is the file ``sync/rows.py``), every other
``localstate.x`` is ``localstate/x.py``. The rewrite changes, in every ``.py``, ``.md``,
``.yml``, ``.toml`` and ``.cfg`` file under localstate/, sync/, tests/, benches/, scripts/
and docs/ (and the top-level files):

* the dotted name, whole names only (``localstate.sync.rows`` -> ``localstate.rows``;
  ``localstate.sync.rows_x`` is left alone);
* ``from localstate.sync import rows`` (a module imported from its package);
* the file's path (``sync/rows.py``, ``localstate/sync/rows.py``).

Both steps are idempotent: re-run them after merging a branch that added a module at an old
place or new mentions of an old name. CHANGELOG.md is left alone (it names the old places on
purpose).
"""

from __future__ import annotations

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
        # the path, also spelled through the localstate/sync link
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
                continue  # seen through localstate/sync -> ../sync: read once, as sync/
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


def main(argv: list[str]) -> int:
    if argv == ["--mv"]:
        print("\n".join(git_mv()) or "nothing to move")
        return 0
    changed: list[Path] = []
    for path in files([Path(a).resolve() for a in argv] or default_paths()):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        new = rewrite(text)
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
