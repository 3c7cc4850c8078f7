"""Airflow-native code on localstate with one setting: ``[state_store] backend``.

Real Airflow 3.3 processes on the suite's PostgreSQL: ``airflow db migrate``, the API server
(with localstate's plugin), the dag processor, the scheduler with the LocalExecutor and a
triggerer. airflow.cfg sets ``[state_store] backend`` to `LocalStateBackend` and a short
``[localstate] flush_interval``; nothing else names localstate. The code is written as
Airflow's docs write it:

* a watcher trigger (`WATCHER`) counting with ``self.asset_state_store.aget/aset``, no mixin;
* a task (`DAG`) reading the watcher's count from ``context["asset_state_store"]``, writing a
  note there, and writing and reading ``context["task_state_store"]``.

The test checks that the watcher's writes go through localstate's store in the triggerer
(localstate's central table holds the owner ``asset_watcher:counted``, claimed by the
triggerer's backend, and Airflow's ``asset_state_store`` follows it through the mirror),
that Airflow's REST API shows the value, and that the task's writes land in both tables
(its asset write recorded as the task's in localstate's table) and in ``task_state_store``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import pytest
import pytest_asyncio
from airflow_api_server import ApiServer, api_server, migrate, new_airflow
from airflow_harness import Deployment, fast_loops, stop, wait_for, within

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

BACKEND = "localstate.airflow.state_backend.LocalStateBackend"
#: the scenario, set-up included, fails after this
BOUND = 420.0

WATCHER = '''
import asyncio

from airflow.triggers.base import BaseEventTrigger


class CountingWatcher(BaseEventTrigger):
    """Counts in its asset's state, as Airflow's docs write a watcher."""

    def serialize(self):
        return ("e2e_backend_watcher.CountingWatcher", {})

    async def run(self):
        count = await self.asset_state_store.aget("count", default=0)
        while True:
            count += 1
            await self.asset_state_store.aset("count", count)
            await asyncio.sleep(0.05)
        yield  # never: no events
'''

DAG = '''
from airflow.sdk import DAG, Asset, AssetWatcher, task

from e2e_backend_watcher import CountingWatcher

counted = Asset("counted", uri="test://counted",
                watchers=[AssetWatcher(name="counter", trigger=CountingWatcher())])

with DAG("e2e_watched", schedule=[counted], catchup=False):
    @task
    def noop():
        pass

    noop()

with DAG("e2e_state_task", schedule=None, catchup=False):
    @task(inlets=[counted])
    def use_state(**context):
        assets = context["asset_state_store"]
        seen = assets.get("count", default=-1)
        assets.set("note", {"seen": seen})
        tasks = context["task_state_store"]
        tasks.set("offset", seen)
        assert tasks.get("offset") == seen

    use_state()
'''


@pytest.fixture(scope="module")
def deployment(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
               ) -> Deployment:
    tmp = tmp_path_factory.mktemp("airflow-state-backend")
    dags, code = tmp / "dags", tmp / "code"
    dags.mkdir()
    code.mkdir()
    (code / "e2e_backend_watcher.py").write_text(WATCHER)
    (dags / "e2e_state_dags.py").write_text(DAG)
    d = new_airflow(pg_server, tmp)
    with (d.home / "airflow.cfg").open("a") as cfg:
        cfg.write(f"\n[state_store]\nbackend = {BACKEND}\n\n")
    d.env.update({
        **fast_loops(dags, health_threshold=4, executor="LocalExecutor"),
        "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL": "0.5",
        "PYTHONPATH": os.pathsep.join([str(code), d.env["PYTHONPATH"]]),
    })
    migrate(d)
    return d


@pytest.fixture(scope="module")
def server(deployment: Deployment) -> Iterator[ApiServer]:
    with api_server(deployment) as s:
        yield s


@pytest_asyncio.fixture
async def db(deployment: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(deployment.airflow_dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def _airflow_value(db: asyncpg.Connection, key: str) -> object:
    value = await db.fetchval(
        "SELECT s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
        "WHERE a.name = 'counted' AND s.key = $1", key)
    return None if value is None else json.loads(value)


async def _central(db: asyncpg.Connection, key: str) -> tuple[object, str] | None:
    row = await db.fetchrow(
        "SELECT value, updated_by FROM localstate_state WHERE owner = 'asset_watcher:counted' "
        "AND key = $1", key)
    return None if row is None else (json.loads(row["value"]), row["updated_by"])


async def test_unchanged_watchers_and_tasks_run_on_localstate(
        deployment: Deployment, server: ApiServer, db: asyncpg.Connection) -> None:
    d = deployment
    procs = [d.start("dag-processor", "dag-processor"),
             d.start("scheduler", "scheduler", "--skip-serve-logs"),
             d.start("triggerer", "triggerer")]
    try:
        await within(BOUND, _scenario(d, server, db), d)
    finally:
        for proc in procs:
            stop(proc)


async def _scenario(d: Deployment, server: ApiServer, db: asyncpg.Connection) -> None:
    # the watcher counts; its writes reach localstate's table, then Airflow's (the mirror)
    async def counting() -> bool:
        central = await _central(db, "count")
        return central is not None and isinstance(central[0], int) and central[0] >= 20

    await wait_for("the watcher's count in localstate's table", counting, d, 300)
    claims = await db.fetch("SELECT owner, epoch, claimant FROM localstate_owner_claim")
    assert [(r["owner"], r["epoch"]) for r in claims] == [("asset_watcher:counted", 1)]
    assert claims[0]["claimant"].endswith("-state-backend")
    first = await _central(db, "count")
    assert first is not None

    async def mirrored() -> bool:
        value = await _airflow_value(db, "count")
        return isinstance(value, int) and value >= 20

    await wait_for("Airflow's asset_state_store to follow", mirrored, d, 60)
    # Airflow's REST API (what its UI reads) shows the value
    asset_id = await db.fetchval("SELECT id FROM asset WHERE name = 'counted'")
    admin = {"Authorization": f"Bearer {server.login('admin')}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin, timeout=60) as client:
        r = await client.get(f"/api/v2/assets/{asset_id}/state-store/count")
        assert r.status_code == 200, r.text
        assert isinstance(r.json()["value"], int)
        assert r.json()["value"] >= 20
    # a task reads the watcher's count and writes both stores, through the API server
    await d.run("dags", "trigger", "e2e_state_task", timeout=240)

    async def finished() -> str | None:
        state = await db.fetchval(
            "SELECT state FROM dag_run WHERE dag_id = 'e2e_state_task'")
        return state if state in ("success", "failed") else None

    assert await wait_for("the task's DAG run", finished, d, 300) == "success", d.tail()
    note = await _airflow_value(db, "note")
    assert isinstance(note, dict)
    assert note["seen"] >= 20  # the count the watcher had flushed
    central = await _central(db, "note")
    assert central is not None
    assert central[0] == note
    assert central[1].startswith("airflow-task:e2e_state_task/")
    offset = await db.fetchval(
        "SELECT value FROM task_state_store WHERE dag_id = 'e2e_state_task' AND key = 'offset'")
    assert json.loads(offset) == note["seen"]
    # and the watcher still counts, in localstate's table
    await asyncio.sleep(1.0)
    later = await _central(db, "count")
    assert later is not None
    assert isinstance(later[0], int)
    assert isinstance(first[0], int)
    assert later[0] > first[0]
