"""Real Airflow 3.3 processes on the suite's PostgreSQL: what the Airflow tests share.

The deployment itself (an isolated ``$AIRFLOW_HOME``, processes in their own sessions, logs
whose tail a failure shows) is `localstate._bench.airflow_deployment`, which the benchmark's
``sink = airflow`` row runs too. Here: `new_deployment` gives each test a fresh metadata
database on the suite's server (`watcher_deployment`: with a test's triggers and DAG file),
`active_watchers` migrates it and activates its Asset Watchers, and `wait_for` and `within`
fail the test (with the logs) on a timeout.

Airflow finds localstate's plugin and provider through its package's entry points. The
installed package's metadata may come from another checkout, so the processes get a
``localstate`` dist-info made from this tree's pyproject.toml first on their path
(`tree_metadata`): they see exactly the entry points this tree declares.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from localstate._bench import airflow_deployment
from localstate._bench.airflow_deployment import (
    AIRFLOW,
    Deployment,
    DeploymentError,
    activate_watchers,
    fast_loops,
    stop,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pip's own copy of tomli, which became tomllib
    from pip._vendor import tomli as tomllib
from localstate._core.version import __version__
from localstate._testing.postgres_server import PostgresServer

__all__ = ["AIRFLOW", "ROOT", "Deployment", "active_watchers", "fast_loops", "new_deployment",
           "stop", "tree_metadata", "wait_for", "watcher_deployment", "within"]

ROOT = Path(__file__).parents[2]

T = TypeVar("T")


def tree_metadata(folder: Path) -> Path:
    """A ``localstate`` dist-info in `folder` declaring this tree's entry points."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist = folder / f"localstate-{__version__}.dist-info"  # pyproject's version is dynamic
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: localstate\nVersion: {__version__}\n")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        + "\n" for group, points in groups.items()))
    return folder


def new_deployment(pg_server: PostgresServer, tmp_path: Path, *, cfg: str = "",
                   env: Mapping[str, str] | None = None,
                   pythonpath: Iterable[Path] = ()) -> Deployment:
    """A fresh metadata DB and ``$AIRFLOW_HOME`` (with `cfg` as its airflow.cfg); the
    processes import this tree, and the modules in `pythonpath` (a test's triggers)."""
    name = f"airflow_{os.getpid()}_{time.monotonic_ns()}"
    pg_server.create_database(name)
    return airflow_deployment.new_deployment(
        pg_server.dsn_for(name), tmp_path, cfg=cfg, env=env,
        pythonpath=[tree_metadata(tmp_path / "metadata"), ROOT, *pythonpath])


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], deployment: Deployment,
                   timeout: float) -> Any:
    """Await `check()` until it returns something truthy; fail with the logs after `timeout`."""
    try:
        return await airflow_deployment.wait_until(what, check, deployment, timeout)
    except DeploymentError as exc:
        pytest.fail(str(exc))


def watcher_deployment(pg_server: PostgresServer, tmp_path: Path, *, triggers: tuple[str, str],
                       dag: tuple[str, str], cfg: str = "", env: Mapping[str, str] | None = None
                       ) -> Deployment:
    """`new_deployment` for a test's Asset Watchers: the module `triggers` (its name, its code)
    on the processes' path, the DAG file `dag` (its name, its code) in the DAG folder, the
    loops fast and a 4 s health-check threshold (`fast_loops`), then `env`."""
    dags, code = tmp_path / "dags", tmp_path / "code"
    for folder in (dags, code):
        folder.mkdir()
    (code / f"{triggers[0]}.py").write_text(triggers[1])
    (dags / f"{dag[0]}.py").write_text(dag[1])
    return new_deployment(pg_server, tmp_path, pythonpath=[code], cfg=cfg,
                          env={**fast_loops(dags, health_threshold=4), **(env or {})})


@contextlib.asynccontextmanager
async def active_watchers(d: Deployment, watchers: int) -> AsyncIterator[asyncpg.Connection]:
    """``airflow db migrate`` on `d`, then its dag processor and scheduler until `watchers`
    Asset Watchers are registered and their assets active; a connection to its metadata DB
    while the block runs."""
    await d.run("db", "migrate")
    db = await asyncpg.connect(d.airflow_dsn)
    try:
        async def count(table: str) -> int:
            return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

        await activate_watchers(d, count, watchers, timeout=120)
        yield db
    finally:
        await db.close()


async def within(bound: float, scenario: Awaitable[T], deployment: Deployment) -> T:
    """Await a test's `scenario`; fail the test with the logs if it takes over `bound` s."""
    try:
        return await asyncio.wait_for(scenario, bound)
    except asyncio.TimeoutError:
        pytest.fail(f"the scenario did not finish within {bound:g} s\n{deployment.tail()}")
