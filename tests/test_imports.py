"""Every module imports first, in a fresh interpreter: no import circle bites at run time.

`localstate.sync` is imported by the store, and imports localstate's lower layers; a module of
either package imported first must still load (it used to fail with a circular ImportError).
The lower layers must not load the store at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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
    assert "localstate.sync.conflicts" in modules
    assert "localstate.store" in modules
    assert len(modules) > 60


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = all_modules()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(modules, pool.map(import_first, modules), strict=True))
    failed = {m: r.stderr.strip().splitlines()[-1:] for m, r in results.items()
              if r.returncode != 0}
    assert failed == {}


@pytest.mark.parametrize("module", [
    "localstate.errors", "localstate.codec", "localstate.model", "localstate.entry",
    "localstate.local_cache", "localstate.config", "localstate.sync.conflicts",
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
