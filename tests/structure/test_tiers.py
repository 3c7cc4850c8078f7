"""The test suite's own layout (tests/conftest.py): each test file sits in the folder of its
kind, a test file imports other test files of its folder only (what folders share lives in
tests/support/), and the quick tier's guard recognises what starts a server."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TESTS, TIERS, server_started_by

SUPPORT = TESTS / "support"


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, on load or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_every_test_file_sits_in_a_tier_folder() -> None:
    stray = [path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")
             if path.relative_to(TESTS).parts[0] not in TIERS]
    assert stray == [], f"move these into one of {TIERS}"
    assert all((TESTS / tier).is_dir() for tier in TIERS)


def test_test_files_import_test_files_of_their_own_folder_only() -> None:
    test_files = {path.stem: path.parent for tier in TIERS
                  for path in (TESTS / tier).glob("test_*.py")}
    crossing = []
    for tier in TIERS:
        for path in sorted((TESTS / tier).glob("*.py")):
            for module in _imported_modules(path) & set(test_files):
                if test_files[module] != path.parent:
                    crossing.append(f"{path.relative_to(TESTS)} imports {module}")
    for path in sorted(SUPPORT.glob("*.py")):
        crossing += [f"support/{path.name} imports {module}"
                     for module in _imported_modules(path) & set(test_files)]
    assert crossing == [], "move what they share into tests/support/"


def test_support_module_names_are_unique_on_the_path() -> None:
    """tests/support/ is on sys.path: a test file of the same name would hide its module."""
    support = {path.stem for path in SUPPORT.glob("*.py")}
    tests = {path.stem for path in TESTS.rglob("*.py") if path.parent != SUPPORT}
    assert support & tests == set()


@pytest.mark.parametrize(("argv", "started"), [
    (["/usr/lib/postgresql/16/bin/initdb", "-D", "/tmp/x"], "initdb"),
    (["/usr/lib/postgresql/16/bin/pg_ctl", "start"], "pg_ctl"),
    (["/usr/sbin/mariadbd", "--datadir=/tmp/x"], "mariadbd"),
    (["/usr/sbin/pgbouncer", "/tmp/pgbouncer.ini"], "pgbouncer"),
    (["/usr/bin/redis-server", "--port", "6380"], "redis-server"),
    (["/usr/bin/prometheus", "--config.file=p.yml"], "prometheus"),
    (["/venv/bin/airflow", "triggerer"], "airflow"),
    (["/venv/bin/python3", "-m", "airflow", "db", "migrate"], "airflow"),
    (["/venv/bin/python", "-m", "moto.server", "-p", "5000"], "moto.server"),
    (["/venv/bin/localstate", "serve", "--port", "8080"], "localstate serve"),
    (["/venv/bin/python", "-m", "localstate.cli", "serve"], "localstate serve"),
    (["/venv/lib/python3.11/site-packages/playwright/driver/node", "cli.js", "run-driver"],
     "Playwright's browser driver"),
    ("/usr/bin/chromium --headless", "chromium"),
    (["/venv/bin/localstate", "get", "dag:x", "k"], None),
    (["/venv/bin/python", "-c", "print('serve')"], None),
    (["sqlite3", "cache.db", "PRAGMA integrity_check"], None),
    (["/usr/lib/postgresql/16/bin/psql", "-c", "SELECT 1"], None),
])
def test_the_guard_knows_what_starts_a_server(argv: list[str] | str, started: str | None
                                               ) -> None:
    assert server_started_by(argv) == started


def test_the_guard_stops_the_process_before_it_starts(tmp_path: Path) -> None:
    """With the guard's audit hook, starting a server raises in the caller (the test fails,
    naming it) and nothing runs; any other program runs as before."""
    marker = tmp_path / "ran"
    script = f"""
import subprocess, sys
from conftest import refuse_servers
sys.addaudithook(refuse_servers)
subprocess.run([sys.executable, "-c", "open({str(marker)!r}, 'w')"], check=True)
try:
    subprocess.run(["{tmp_path}/airflow", "triggerer"])
except RuntimeError as exc:
    print(exc)
else:
    print("started")
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(SUPPORT)])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert marker.exists()  # the plain program ran
    assert "this test starts airflow" in done.stdout, done.stdout
