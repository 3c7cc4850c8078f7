"""Real Airflow 3.3 processes on the suite's PostgreSQL: what the Airflow tests share.

`new_deployment` makes an isolated ``$AIRFLOW_HOME`` and a fresh metadata database on the
suite's server; `Deployment.start` runs an ``airflow`` command as a process of its own (its own
session, so a signal to the group reaches its children), logging to a file whose tail a
failure shows; `Deployment.run` runs one to completion.

Airflow finds localstate's plugin and provider through its package's entry points. The
installed package's metadata may come from another checkout, so the processes get a
``localstate`` dist-info made from this tree's pyproject.toml first on their path
(`tree_metadata`): they see exactly the entry points this tree declares.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localstate.config import default_triggerer_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pip's own copy of tomli, which became tomllib
    from pip._vendor import tomli as tomllib
from localstate.testing.postgres_server import PostgresServer

AIRFLOW = Path(sys.executable).with_name("airflow")
ROOT = Path(__file__).parents[1]


def tree_metadata(folder: Path) -> Path:
    """A ``localstate`` dist-info in `folder` declaring this tree's entry points."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist = folder / f"localstate-{project['version']}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: localstate\nVersion: {project['version']}\n")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in points.items())
        + "\n" for group, points in groups.items()))
    return folder


@dataclass
class Deployment:
    home: Path
    env: dict[str, str]
    airflow_dsn: str
    logs: Path

    @property
    def cache_path(self) -> Path:
        return self.home / "localstate" / f"{default_triggerer_id()}.db"

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        # own session: a SIGKILL of the group takes the process's children with it
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen([str(AIRFLOW), *args], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    async def run(self, *args: str, timeout: float = 300) -> str:
        """Run ``airflow *args`` to the end; its output (the test fails if it fails)."""
        proc = await asyncio.create_subprocess_exec(
            str(AIRFLOW), *args, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except BaseException:  # stopped by a bound: leave nothing running
            proc.kill()
            await proc.wait()
            raise
        text = output.decode(errors="replace")
        assert proc.returncode == 0, f"airflow {' '.join(args)} failed:\n{text[-4000:]}"
        return text

    def tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
            for p in sorted(self.logs.glob("*.log"))
        )


def new_deployment(pg_server: PostgresServer, tmp_path: Path, *, cfg: str = "",
                   env: Mapping[str, str] | None = None) -> Deployment:
    """A fresh metadata DB and ``$AIRFLOW_HOME`` (with `cfg` as its airflow.cfg)."""
    name = f"airflow_{os.getpid()}_{time.monotonic_ns()}"
    pg_server.create_database(name)
    airflow_dsn = pg_server.dsn_for(name)
    home = tmp_path / "airflow-home"
    home.mkdir(exist_ok=True)
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (home / "airflow.cfg").write_text(cfg)
    meta = tree_metadata(tmp_path / "metadata")
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW__", "LOCALSTATE_"))}
    full.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_dsn.replace(
            "postgresql://", "postgresql+psycopg://"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(logs / "airflow"),
        "PYTHONPATH": os.pathsep.join(
            [str(meta), *filter(None, [os.environ.get("PYTHONPATH")]), str(ROOT)]),
        "PYTHONWARNINGS": "ignore",
    })
    full.update(env or {})
    return Deployment(home, full, airflow_dsn, logs)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 20) -> None:
    """Signal `proc`'s process group and wait for it (SIGKILL after `wait` seconds)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


async def wait_for(what: str, check: Callable[[], Awaitable[Any]], deployment: Deployment,
                   timeout: float) -> Any:
    """Await `check()` until it returns something truthy; fail with the logs after `timeout`."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > end:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n{deployment.tail()}")
        await asyncio.sleep(0.5)
