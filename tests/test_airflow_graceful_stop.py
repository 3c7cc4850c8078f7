"""A graceful stop (SIGTERM) of a real ``airflow triggerer`` flushes every acknowledged write,
for each sink (issue #14 item 5), and a moved trigger resumes from the last acknowledged value.

Real Airflow 3.3 components on the suite's PostgreSQL: ``airflow db migrate``, the dag
processor and the scheduler until the watched assets are active, then ``airflow triggerer``
running `WATCHERS` Asset Watchers whose trigger (`TRIGGER`, with localstate's mixin) sets its
watermark in a hot loop. The triggerer's process group gets SIGTERM, as ``kill`` of a shell
job or a container stop sends it. Then

* each watermark in the central store (Airflow's ``asset_state_store`` with ``sink =
  airflow``, localstate's table with ``sink = sql``) equals the one in the stopped
  triggerer's local cache: the last acknowledged write, flushed before the process exited;
* a second triggerer, with a cache file of its own (another host), runs the same triggers:
  each starts from that value (the trigger records where it started).

Before the fix, with ``sink = airflow``, the flush ran in ``cleanup()`` after Airflow's runner
had closed its supervisor channel, waited out its timeout, and left the central value behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from localstate.testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

AIRFLOW = Path(sys.executable).with_name("airflow")
WATCHERS = 4
BOUND = 420.0

TRIGGER = '''
from __future__ import annotations

import asyncio
from typing import Any

from airflow.triggers.base import BaseEventTrigger

from localstate.airflow.trigger import StateEnabledTrigger


class CountingTrigger(StateEnabledTrigger, BaseEventTrigger):
    """Counts up its watermark forever; records the value it started from."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("stop_triggers.CountingTrigger", {"name": self.name})

    async def run(self):
        n = await self.get_watermark(default=0)
        await self.state_variable("started_from").set(n)
        while True:
            n += 1
            await self.set_watermark(n)
            await asyncio.sleep(0.002)
        yield  # an async generator, as Airflow wants
'''

DAG = f'''
from airflow.sdk import DAG, Asset, AssetWatcher, task
from stop_triggers import CountingTrigger

assets = [Asset(name=f"count_{{i}}", uri=f"count://{{i}}", watchers=[AssetWatcher(
    name=f"w{{i}}", trigger=CountingTrigger(name=f"count_{{i}}"))]) for i in range({WATCHERS})]

with DAG(dag_id="counting", schedule=assets):
    @task
    def nothing() -> None: ...
    nothing()
'''


def _start(env: dict[str, str], logs: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    with (logs / f"{name}.log").open("ab") as out:
        return subprocess.Popen([str(AIRFLOW), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _signal_and_wait(proc: subprocess.Popen[bytes], sig: int, wait: float = 60) -> float:
    """Send `sig` to the process group; return how long the process took to exit."""
    started = time.monotonic()
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return time.monotonic() - started


def _tail(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n" + "\n".join(
        p.read_text(errors="replace").splitlines()[-30:]) for p in sorted(logs.glob("*.log")))


async def _wait_for(what: str, check: Any, logs: Path, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n{_tail(logs)}")
        await asyncio.sleep(0.5)


def _local_values(cache: Path, key: str) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT owner, value FROM state WHERE key = ?", (key,)).fetchall()
    return {owner: int(json.loads(value)) for owner, value in rows if value is not None}


class Central:
    """The central values of a key, per owner, wherever the sink puts them."""

    def __init__(self, sink: str, airflow: asyncpg.Connection, state: asyncpg.Connection
                 ) -> None:
        self.sink, self.airflow, self.state = sink, airflow, state

    async def values(self, key: str) -> dict[str, int]:
        if self.sink == "airflow":
            rows = await self.airflow.fetch(
                "SELECT 'asset_watcher:' || a.name AS owner, s.value FROM asset_state_store s "
                "JOIN asset a ON a.id = s.asset_id WHERE s.key = $1", key)
        else:
            exists = await self.state.fetchval(
                "SELECT to_regclass('localstate_state_variable') IS NOT NULL")
            if not exists:  # the triggerer's store creates it when it opens
                return {}
            rows = await self.state.fetch(
                "SELECT owner, value FROM localstate_state_variable WHERE key = $1 "
                "AND value IS NOT NULL", key)
        return {r["owner"]: int(json.loads(r["value"])) for r in rows}


@pytest.mark.parametrize("sink", ["airflow", "sql"])
async def test_sigterm_flushes_every_acknowledged_write(
    pg_server: PostgresServer, tmp_path: Path, sink: str,
) -> None:
    try:
        await asyncio.wait_for(_scenario(pg_server, tmp_path, sink), BOUND)
    except asyncio.TimeoutError:
        pytest.fail(f"the scenario did not finish within {BOUND:g} s\n{_tail(tmp_path / 'logs')}")


async def _scenario(pg_server: PostgresServer, tmp: Path, sink: str) -> None:
    suffix = f"{os.getpid()}_{int(time.time() * 1000)}"
    pg_server.create_database(f"airflow_{suffix}")
    pg_server.create_database(f"state_{suffix}")
    airflow_dsn = pg_server.dsn_for(f"airflow_{suffix}")
    state_dsn = pg_server.dsn_for(f"state_{suffix}")
    home, dags, code, logs = (tmp / n for n in ("home", "dags", "code", "logs"))
    for folder in (home, dags, code, logs):
        folder.mkdir()
    (code / "stop_triggers.py").write_text(TRIGGER)
    (dags / "counting.py").write_text(DAG)
    (home / "airflow.cfg").write_text(
        f"[localstate]\nsink = {sink}\nflush_interval = 1.0\ndurability = local\n"
        f"conflict_policy = max\ncentral_url = {state_dsn}\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW__", "LOCALSTATE_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "PYTHONPATH": os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), str(code)) if p),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_dsn.replace(
            "postgresql://", "postgresql+psycopg://"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "4",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(logs / "airflow"),
        "PYTHONWARNINGS": "ignore",
    })
    migrate = await asyncio.create_subprocess_exec(
        str(AIRFLOW), "db", "migrate", env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    output, _ = await migrate.communicate()
    assert migrate.returncode == 0, output.decode()[-3000:]
    airflow_db = await asyncpg.connect(airflow_dsn)
    state_db = await asyncpg.connect(state_dsn)
    central = Central(sink, airflow_db, state_db)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_start(env, logs, "dag-processor", "dag-processor"))
        scheduler = _start(env, logs, "scheduler", "scheduler", "--skip-serve-logs")
        procs.append(scheduler)

        async def active() -> bool:
            return bool(await airflow_db.fetchval("SELECT count(*) FROM asset_active") == WATCHERS)

        await _wait_for("the assets to be active", active, logs, 120)
        _signal_and_wait(scheduler, signal.SIGTERM)

        async def watchers() -> bool:
            return bool(await airflow_db.fetchval("SELECT count(*) FROM asset_watcher") == WATCHERS)

        await _wait_for("the watchers", watchers, logs, 60)
        first = _start({**env, "AIRFLOW__LOCALSTATE__TRIGGERER_ID": "host-a"}, logs,
                       "triggerer-a", "triggerer", "--skip-serve-logs")
        procs.append(first)

        async def all_flushing() -> bool:
            values = await central.values("watermark")
            return len(values) == WATCHERS and min(values.values()) > 50

        await _wait_for("every watcher's watermark centrally", all_flushing, logs, 90)
        await asyncio.sleep(1.5)  # writing hot, and flushed on the interval
        took = _signal_and_wait(first, signal.SIGTERM)
        acknowledged = _local_values(home / "localstate" / "host-a.db", "watermark")
        flushed = await central.values("watermark")
        print(f"\nsink {sink}: SIGTERM to exit {took:.2f} s; acknowledged {acknowledged}, "
              f"central {flushed}")
        assert len(acknowledged) == WATCHERS
        assert flushed == acknowledged, _tail(logs)

        # the triggers move to another triggerer (its own cache file): each resumes from the
        # value acknowledged last on the first one
        second = _start({**env, "AIRFLOW__LOCALSTATE__TRIGGERER_ID": "host-b"}, logs,
                        "triggerer-b", "triggerer", "--skip-serve-logs")
        procs.append(second)

        async def all_resumed() -> dict[str, int] | None:
            started = await central.values("started_from")
            return started if started.keys() == acknowledged.keys() and all(
                v >= acknowledged[o] for o, v in started.items()) else None

        resumed = await _wait_for("the second triggerer to resume", all_resumed, logs, 90)
        assert resumed == acknowledged
        _signal_and_wait(second, signal.SIGTERM)
        assert await central.values("watermark") == _local_values(
            home / "localstate" / "host-b.db", "watermark")
    finally:
        for proc in procs:
            _signal_and_wait(proc, signal.SIGKILL, 10)
        await airflow_db.close()
        await state_db.close()
