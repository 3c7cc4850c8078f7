"""The benchmark's ``sink = airflow`` row: a flush of N dirty keys inside a real triggerer.

The ``airflow`` sink writes through the accessors Airflow 3.3 gives a watcher trigger: each
call goes over the trigger runner's socket to the triggerer's supervisor, which makes it an
Execution API call and a transaction on Airflow's metadata DB. A flush outside a triggerer would
not measure that, so this runs a real deployment (`localstate._bench.airflow_deployment`) on
PostgreSQL: a fresh metadata DB on the central server (or on a throwaway server, when the
central DB is not PostgreSQL), ``airflow db migrate``, the dag processor and the scheduler
until the benchmark's asset watcher is active, then ``airflow triggerer`` running
`localstate._bench.airflow_flush_trigger.FlushBenchTrigger`. The trigger dirties N keys and
flushes them when told; the time is the trigger's own, the commits are PostgreSQL's
(``pg_stat_database.xact_commit`` of the metadata DB: every transaction the deployment made
while the flush ran, the Execution API's and the triggerer's own loop's).

PostgreSQL reports a backend's commits to ``pg_stat_database`` when it goes idle, at most once
a second, and an idle backend's last ones up to 10 s later. So the commits are read again
`SETTLE` seconds after the flush ends, and what the deployment commits at rest in that time
(its rate measured before the flush, over as long) is taken off.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from localstate._bench.airflow_deployment import (
    Deployment,
    DeploymentError,
    activate_watchers,
    airflow_command,
    fast_loops,
    new_deployment,
    stop,
    wait_until,
)

__all__ = ["SETTLE", "AirflowFlush", "airflow_sink_unavailable", "measure_airflow_flush"]

#: seconds after the flush until PostgreSQL has reported every commit made during it
SETTLE = 11.0
#: the watermarks' policy the README recommends with ``sink = airflow``: under ``max`` each
#: key's flush is an ``aget`` (read-compare) and an ``aset``
POLICY = "asset_watcher:*=max, *=reject"


@dataclass
class AirflowFlush:
    keys: int
    seconds: float
    #: transactions the metadata DB committed during the flush
    commits: int
    #: the deployment's commits per second at rest (taken off `commits` for the settle time)
    idle_commits_per_s: float
    flushes: int
    asets: int
    agets: int
    #: where the metadata DB ran
    server: str
    #: seconds of the trigger's first call through the supervisor (not in `seconds`)
    warm_up_s: float

    @property
    def rows_per_s(self) -> float:
        return self.keys / self.seconds if self.seconds else 0.0


def airflow_sink_unavailable() -> str | None:
    """Why the row cannot run in this environment (None: it can)."""
    if importlib.util.find_spec("airflow") is None or airflow_command() is None:
        return ("apache-airflow is not installed: pip install 'localstate[airflow]' "
                "(Airflow 3.3), then run again")
    return None


def _config(keys: int) -> str:
    # no flush before the benchmark says go: the interval is a day, the batch above the keys
    return (f"[localstate]\nsink = airflow\nflush_interval = 86400\n"
            f"max_batch = {max(10_000, keys + 1)}\nconflict_policy = {POLICY}\n")


@contextlib.asynccontextmanager
async def _metadata_db(central_url: str, folder: Path) -> AsyncIterator[tuple[str, str, str]]:
    """An empty database for Airflow's metadata: (its DSN, a DSN to watch it from, where).

    On the central URL's PostgreSQL server when it is one (created there, dropped after),
    else on a throwaway server (`localstate._testing.postgres_server`) in `folder`."""
    import asyncpg  # the postgres extra

    name = f"localstate_bench_airflow_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    url = make_url(central_url)
    if url.get_backend_name() == "postgresql":
        admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        except asyncpg.PostgresError as exc:
            raise DeploymentError(
                f"could not create Airflow's metadata database on the central server ({exc}): "
                "grant the central URL's user CREATEDB, or run with --no-airflow-sink") from exc
        finally:
            await conn.close()
        try:
            yield (url.set(drivername="postgresql", database=name)
                   .render_as_string(hide_password=False), admin, "the central PostgreSQL")
        finally:
            conn = await asyncpg.connect(admin)
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            finally:
                await conn.close()
        return
    from localstate._testing.postgres_server import PostgresServer

    try:
        server = PostgresServer(folder / "postgres")
        await asyncio.to_thread(server.start)
    except (RuntimeError, OSError) as exc:
        raise DeploymentError(
            f"the central DB is not PostgreSQL and no throwaway PostgreSQL could start "
            f"({exc}): run with --central-url postgresql://…") from exc
    try:
        await asyncio.to_thread(server.create_database, name)
        yield server.dsn_for(name), server.dsn, "a throwaway PostgreSQL"
    finally:
        await asyncio.to_thread(server.close)


def _folders(folder: Path) -> tuple[Path, Path]:
    """(where the trigger and the benchmark exchange files, the DAG folder with its file)."""
    talk, dags = folder / "trigger", folder / "dags"
    for made in (talk, dags):
        made.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).with_name("airflow_flush_dag.py"), dags / "bench_flush.py")
    return talk, dags


async def measure_airflow_flush(central_url: str, folder: Path, keys: int,
                                status: Callable[[str], None]) -> AirflowFlush:
    """Flush `keys` dirty keys through ``sink = airflow`` in a real ``airflow triggerer``;
    `status` hears what it is doing (a step takes up to minutes)."""
    import asyncpg  # the postgres extra

    command = airflow_command()
    if command is None:
        raise DeploymentError(airflow_sink_unavailable() or "no airflow command")
    talk, dags = _folders(folder)
    async with _metadata_db(central_url, folder) as (dsn, watch_dsn, where):
        d = new_deployment(dsn, folder, cfg=_config(keys), command=command, env={
            **fast_loops(dags),
            "LOCALSTATE_BENCH_FOLDER": str(talk),
            "LOCALSTATE_BENCH_KEYS": str(keys),
        })
        status(f"airflow db migrate on {where}")
        await d.run("db", "migrate", timeout=900)
        airflow_db = await asyncpg.connect(dsn)
        watch = await asyncpg.connect(watch_dsn)
        try:
            async def count(table: str) -> int:
                return int(await airflow_db.fetchval(f"SELECT count(*) FROM {table}"))

            status("dag processor and scheduler: activating the asset watcher")
            await activate_watchers(d, count, 1)
            await airflow_db.close()  # its commits would count
            name = make_url(dsn).database or ""

            async def commits() -> int:
                return int(await watch.fetchval(
                    "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", name))

            return await _run_triggerer(d, talk, keys, commits, status, where)
        finally:
            await watch.close()
            if not airflow_db.is_closed():
                await airflow_db.close()


async def _run_triggerer(d: Deployment, talk: Path, keys: int,
                         commits: Callable[[], Awaitable[int]],
                         status: Callable[[str], None], where: str) -> AirflowFlush:
    status(f"airflow triggerer: the trigger sets {keys:,} keys")
    triggerer = d.start("triggerer", "triggerer", "--skip-serve-logs")
    try:
        ready = talk / "ready.json"

        async def is_ready() -> bool:
            return ready.exists()

        await wait_until("the bench trigger's keys", is_ready, d, 300 + keys * 0.01)
        # what the deployment commits at rest, over as long as the settle time
        rest0, began = await commits(), time.monotonic()
        await asyncio.sleep(SETTLE)
        idle_rate = (await commits() - rest0) / (time.monotonic() - began)
        before = await commits()
        (talk / "go").touch()
        done = talk / "done.json"
        progress = talk / "progress.json"

        async def is_done() -> bool:
            if progress.exists():
                p = json.loads(progress.read_text())
                status(f"sink = airflow: {keys - p['dirty']:,} of {keys:,} keys flushed in "
                       f"{p['seconds']:.0f} s")
            return done.exists()

        # the slowest the supervisor was seen answering: about 7 requests a second, 2 a key;
        # three times that time
        await wait_until(f"the flush of {keys:,} keys", is_done, d, 120 + keys * 1.0, every=1)
        await asyncio.sleep(SETTLE)
        after = await commits()
    finally:
        await asyncio.to_thread(stop, triggerer)
    result = json.loads(done.read_text())
    warm_up = json.loads(ready.read_text())["warm_up_s"]
    if result["errors"]:
        status(f"sink = airflow: {result['errors']} flushes failed ({result['last_error']})")
    flushed = after - before - round(idle_rate * SETTLE)
    return AirflowFlush(keys=result["keys"], seconds=result["seconds"], commits=flushed,
                        idle_commits_per_s=idle_rate, flushes=result["flushes"],
                        asets=result["asets"], agets=result["agets"], server=where,
                        warm_up_s=warm_up)
