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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from localstate._core.config import default_triggerer_id
from localstate.errors import LocalStateError

__all__ = ["AIRFLOW", "Deployment", "DeploymentError", "RunningWatchers", "activate_watchers",
           "airflow_command", "fast_loops", "localstate_api_healthy", "new_deployment",
           "pg_commits", "running_watchers", "stop", "wait_until", "with_api_sink"]

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


async def localstate_api_healthy(url: str) -> bool:
    """Whether localstate's app answers at `url` (the API server's ``…/localstate``): its
    health check returns JSON, not Airflow's page for an unknown path."""
    import httpx  # the ``client`` extra: only the benchmarks that start an API server need it

    try:
        async with httpx.AsyncClient(timeout=5) as client:
            r = await client.get(f"{url}/api/v1/health")
    except httpx.TransportError:
        return False
    return str(r.headers.get("content-type", "")).startswith("application/json")


def with_api_sink(deployment: Deployment, token: str, flush_interval: float) -> Deployment:
    """`deployment` whose processes flush through localstate's plugin in its API server
    (``sink = api``, with `token`) every `flush_interval` seconds: a triggerer's settings."""
    return replace(deployment, env={
        **deployment.env,
        "AIRFLOW__LOCALSTATE__SINK": "api",
        "AIRFLOW__LOCALSTATE__API_URL": f"{deployment.env['AIRFLOW__API__BASE_URL']}/localstate",
        "AIRFLOW__LOCALSTATE__API_TOKEN": token,
        "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL": str(flush_interval)})


async def pg_commits(db: Any) -> int:
    """Transactions committed so far in the whole PostgreSQL server of `db` (an asyncpg
    connection): a phase's cost is the difference around it, whoever made them."""
    return int(await db.fetchval("SELECT sum(xact_commit) FROM pg_stat_database"))


@dataclass
class RunningWatchers:
    """What `running_watchers` yields: the deployment's processes and a connection."""

    #: an asyncpg connection to the metadata DB
    db: Any
    api_server: subprocess.Popen[bytes]
    triggerer: subprocess.Popen[bytes]


@contextlib.asynccontextmanager
async def running_watchers(deployment: Deployment, watchers: int, *, token: str,
                           flush_interval: float) -> AsyncIterator[RunningWatchers]:
    """The asset-event benchmarks' deployment: ``airflow db migrate``, the API server with
    localstate's plugin answering, the DAGs' `watchers` asset watchers registered and active
    (`activate_watchers`), then ONE triggerer flushing through the API server
    (`with_api_sink`, `token`, `flush_interval`) running every watcher's trigger. Both
    processes are stopped on exit."""
    import asyncpg  # the postgres extra

    print("airflow db migrate ...", flush=True)
    await deployment.run("db", "migrate", timeout=600)
    db = await asyncpg.connect(deployment.airflow_dsn)
    api = deployment.start("api-server", "api-server", "--workers", "1")
    triggerer = None
    try:
        async def healthy() -> bool:
            return await localstate_api_healthy(
                f"{deployment.env['AIRFLOW__API__BASE_URL']}/localstate")

        await wait_until("the API server", healthy, deployment, 240)

        async def count(table: str) -> int:
            return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

        print("registering the watchers ...", flush=True)
        await activate_watchers(deployment, count, watchers)
        triggerer = with_api_sink(deployment, token, flush_interval).start(
            "triggerer", "triggerer", "--skip-serve-logs")

        async def running() -> bool:
            return int(await db.fetchval(
                "SELECT count(*) FROM trigger WHERE triggerer_id IS NOT NULL")) >= watchers

        await wait_until("the triggers running", running, deployment, 180)
        yield RunningWatchers(db, api, triggerer)
    finally:
        if triggerer is not None:
            stop(triggerer)
        stop(api)
        await db.close()
