"""A real Airflow 3.3 deployment on PostgreSQL: the benchmark's ``sink = airflow`` row and the
test suite's Airflow tests run the same one.

`new_deployment` makes an isolated ``$AIRFLOW_HOME`` (with the given airflow.cfg) over an empty
metadata database; `Deployment.run` runs an ``airflow`` command to the end, `Deployment.start`
runs one as a process of its own (its own session, so a signal to the group reaches its
children) logging to a file whose tail an error shows. `activate_watchers` runs the dag
processor and the scheduler until the DAGs' asset watchers are registered and their assets
active (the triggerer writes asset state of active assets only), then stops them.

The processes see none of the caller's ``AIRFLOW__*`` and ``LOCALSTATE_*`` variables: a
deployment never reaches another one's database or settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localstate._core.config import default_triggerer_id
from localstate.errors import LocalStateError

__all__ = ["AIRFLOW", "Deployment", "DeploymentError", "activate_watchers", "airflow_command",
           "fast_loops", "new_deployment", "stop", "wait_until"]

#: the ``airflow`` command of this interpreter's environment
AIRFLOW = Path(sys.executable).with_name("airflow")


class DeploymentError(LocalStateError):
    """An ``airflow`` command failed, or the deployment did not get where it was awaited."""


def airflow_command() -> Path | None:
    """The ``airflow`` command beside this interpreter (else on PATH); None: not installed."""
    if AIRFLOW.exists():
        return AIRFLOW
    found = shutil.which("airflow")
    return Path(found) if found else None


@dataclass
class Deployment:
    home: Path
    env: dict[str, str]
    airflow_dsn: str
    logs: Path
    command: Path = AIRFLOW

    @property
    def cache_path(self) -> Path:
        """The local cache file of a triggerer with the default ``triggerer_id``."""
        return self.home / "localstate" / f"{default_triggerer_id()}.db"

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        # own session: a SIGKILL of the group takes the process's children with it
        with (self.logs / f"{name}.log").open("ab") as log:
            return subprocess.Popen([str(self.command), *args], env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    async def run(self, *args: str, timeout: float = 300) -> str:
        """Run ``airflow *args`` to the end; its output (`DeploymentError` if it fails)."""
        proc = await asyncio.create_subprocess_exec(
            str(self.command), *args, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except BaseException:  # stopped by a bound: leave nothing running
            proc.kill()
            await proc.wait()
            raise
        text = output.decode(errors="replace")
        if proc.returncode != 0:
            raise DeploymentError(f"airflow {' '.join(args)} failed:\n{text[-4000:]}")
        return text

    def tail(self) -> str:
        """The last lines of every process's log."""
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
            for p in sorted(self.logs.glob("*.log"))
        )


def fast_loops(dags: Path, *, parse_every: int = 2, health_threshold: float | None = None,
               executor: str | None = None) -> dict[str, str]:
    """Airflow's settings for a deployment that moves in seconds rather than minutes: the DAGs
    in `dags`, unpaused when created, parsed again every `parse_every` s, the scheduler beating
    every second. With `health_threshold`, triggerers beat every second too and one silent for
    that long is dead (its triggers move); `executor` runs the consumer DAGs' tasks."""
    env = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(parse_every),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(parse_every),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
    }
    if health_threshold is not None:
        env["AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC"] = "1"
        env["AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD"] = f"{health_threshold:g}"
    if executor is not None:
        env["AIRFLOW__CORE__EXECUTOR"] = executor
    return env


def new_deployment(airflow_dsn: str, folder: Path, *, cfg: str = "",
                   env: Mapping[str, str] | None = None, pythonpath: Iterable[Path] = (),
                   command: Path = AIRFLOW) -> Deployment:
    """``$AIRFLOW_HOME`` in `folder` (`cfg` its airflow.cfg) over the empty PostgreSQL database
    `airflow_dsn` (``postgresql://…``); `pythonpath` goes first on the processes' path."""
    home = folder / "airflow-home"
    home.mkdir(parents=True, exist_ok=True)
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    (home / "airflow.cfg").write_text(cfg)
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW__", "LOCALSTATE_"))}
    full.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_dsn.replace(
            "postgresql://", "postgresql+psycopg://", 1),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(logs / "airflow"),
        "PYTHONPATH": os.pathsep.join(
            [*map(str, pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "PYTHONWARNINGS": "ignore",
    })
    full.update(env or {})
    return Deployment(home, full, airflow_dsn, logs, command)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 20) -> float:
    """Signal `proc`'s process group and wait for it (SIGKILL after `wait` seconds); return
    how long it took to exit."""
    started = time.monotonic()
    if proc.poll() is not None:
        return 0.0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    return time.monotonic() - started


async def wait_until(what: str, check: Callable[[], Awaitable[Any]], deployment: Deployment,
                     timeout: float, *, every: float = 0.5) -> Any:
    """Await `check()` until it returns something truthy; `DeploymentError` with the logs'
    tails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > end:
            raise DeploymentError(
                f"timed out after {timeout:g} s waiting for {what}\n{deployment.tail()}")
        await asyncio.sleep(every)


async def activate_watchers(deployment: Deployment, count: Callable[[str], Awaitable[int]],
                            watchers: int, timeout: float = 300) -> None:
    """Run the dag processor and the scheduler until `watchers` asset watchers are registered
    and their assets active, then stop both (they would only compete for the cores).

    `count(table)` answers ``SELECT count(*)`` of a metadata table (the caller's connection).
    """
    procs = [deployment.start("dag-processor", "dag-processor"),
             deployment.start("scheduler", "scheduler", "--skip-serve-logs")]
    try:
        for table in ("asset_active", "asset_watcher"):
            async def done(table: str = table) -> bool:
                return await count(table) >= watchers

            await wait_until(f"{watchers} rows in {table}", done, deployment, timeout)
    finally:
        for proc in procs:
            stop(proc)
