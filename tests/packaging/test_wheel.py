"""The release: `python -m build` makes an sdist and a wheel that hold the whole package, and
the wheel installs into a fresh virtual environment beside Airflow 3.3 under pinned
constraints, where Airflow finds the plugin and the provider and migrates localstate's tables.

The top-level `sync/` installs as `localstate._sync` (pyproject's package-dir mapping): the
sdist holds it as `sync/`, the wheel built from that sdist under ``localstate/_sync/``, and
neither has a top-level `sync` package to install. The module builds once (`python -m build`:
the sdist, then the wheel from it, as a release is made); both tests read that build. The pins are
`tests/data/constraints-airflow-3.3.2-py3.11.txt` (its header says where they come from). The
install reuses pip's cache.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "tests" / "data" / "constraints-airflow-3.3.2-py3.11.txt"
VERSION = metadata.version("localstate")


def _build(out: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out),
                           str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # setuptools' deprecation banners ("!!") would end a build on a later setuptools
    assert "!!" not in proc.stdout + proc.stderr, proc.stdout[-3000:]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's sdist and the wheel built from it, built once for the module."""
    out = tmp_path_factory.mktemp("dist")
    _build(out)
    return out


def _sync_modules() -> set[str]:
    """sync/'s files, its layer folders' included, relative to it."""
    return {p.relative_to(ROOT / "sync").as_posix() for p in (ROOT / "sync").rglob("*.py")}


def test_the_build_makes_an_sdist_and_a_wheel_with_the_whole_package(dist: Path) -> None:
    wheel = dist / f"localstate-{VERSION}-py3-none-any.whl"
    sdist = dist / f"localstate-{VERSION}.tar.gz"
    assert wheel.is_file()
    assert sdist.is_file()

    names = set(zipfile.ZipFile(wheel).namelist())
    in_wheel_sync = {n.removeprefix("localstate/_sync/") for n in names
                     if n.startswith("localstate/_sync/") and n.endswith(".py")}
    assert in_wheel_sync == _sync_modules()
    # pyproject lists the packages one by one (sync/ is mapped): a new folder left out of the
    # list would be missing from the wheel while an editable install still finds it
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "localstate").rglob("*.py")}
    assert sources - names == set()
    assert not any(n.startswith("sync/") for n in names)  # never a top-level `sync`
    for path in ("localstate/py.typed", "localstate/_sync/py.typed",
                 "localstate/api/static/index.html", "localstate/api/static/app.js",
                 "localstate/airflow/_migrations/alembic.ini",
                 "localstate/airflow/_migrations/env.py",
                 f"localstate-{VERSION}.dist-info/licenses/LICENSE"):
        assert path in names, path
    revisions = {n for n in names if n.startswith("localstate/airflow/_migrations/versions/")}
    assert len(revisions) == len(list(
        (ROOT / "localstate/airflow/_migrations/versions").glob("*.py")))
    entry_points = zipfile.ZipFile(wheel).read(
        f"localstate-{VERSION}.dist-info/entry_points.txt").decode()
    assert "localstate.airflow.plugin:LocalStatePlugin" in entry_points
    assert "localstate.airflow.provider:get_provider_info" in entry_points

    with tarfile.open(sdist) as tar:
        members = {m.name: m for m in tar.getmembers()}
    top = f"localstate-{VERSION}"
    for module in _sync_modules():
        assert members[f"{top}/sync/{module}"].isfile(), module
    assert not any(name.startswith(f"{top}/localstate/_sync") for name in members)
    assert f"{top}/LICENSE" in members


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> str:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_wheel_installs_beside_airflow_and_airflow_finds_it(dist: Path, tmp_path: Path
                                                               ) -> None:
    wheel = dist / f"localstate-{VERSION}-py3-none-any.whl"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW__", "LOCALSTATE_", "PYTHON", "VIRTUAL_ENV"))}
    home = tmp_path / "airflow-home"
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False",
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    # the deployment guide's command, with the pinned set for this Python
    _run([str(bin_dir / "pip"), "install", "-q",
          f"{wheel}[airflow,api,client,postgres]", "--constraint", str(CONSTRAINTS)],
         env, tmp_path, timeout=600)
    _run([str(bin_dir / "pip"), "check"], env, tmp_path)

    # the installed copy, not this checkout, and its sync layer under localstate._sync
    where = json.loads(_run([str(bin_dir / "python"), "-c",
                             "import json, localstate, localstate._sync.flush.worker, "
                             "localstate.api._app, localstate.airflow.plugin; "
                             "print(json.dumps([localstate.__file__, "
                             "localstate._sync.flush.worker.__file__]))"], env, tmp_path))
    site = str(venv)
    assert all(path.startswith(site) for path in where), where

    plugins = json.loads(_run([str(bin_dir / "airflow"), "plugins", "-o", "json"], env,
                              tmp_path))
    mine = [p for p in plugins if p["name"] == "localstate"]
    assert len(mine) == 1, plugins
    assert mine[0]["fastapi_apps"][0]["url_prefix"] == "/localstate"
    assert mine[0]["external_views"][0]["name"] == "State variables"

    providers = json.loads(_run([str(bin_dir / "airflow"), "providers", "list", "-o", "json"],
                                env, tmp_path))
    assert [p["version"] for p in providers if p["package_name"] == "localstate"] == [VERSION]

    config = _run([str(bin_dir / "airflow"), "config", "list", "--section", "localstate",
                   "--show-values", "--include-env-vars"], env, tmp_path)
    assert "AIRFLOW__LOCALSTATE__SINK" in config
    assert "flush_interval = 1.0" in config

    # the migrations travel in the wheel: airflow db migrate creates localstate's tables
    _run([str(bin_dir / "airflow"), "db", "migrate"], env, tmp_path, timeout=300)
    with sqlite3.connect(home / "airflow.db") as db:
        tables = {row[0] for row in db.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'localstate%'")}
        head = db.execute("SELECT version_num FROM localstate_alembic_version").fetchall()
    assert {"localstate_state", "localstate_owner_claim", "localstate_fleet",
            "localstate_alembic_version"} <= tables
    revisions = len(list((ROOT / "localstate/airflow/_migrations/versions").glob("*.py")))
    assert head == [(f"localstate_{revisions:04d}",)]

    out = _run([str(bin_dir / "localstate"), "config"], env, tmp_path)
    assert "sink" in out
