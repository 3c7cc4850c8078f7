"""Tasks, workers and the scheduler through `sink = api`: a real subprocess with Airflow's
database blocked (as the task supervisor blocks it) and no central_url reads a watcher's
watermark and writes its own state through a real `localstate serve`, with the blocking and
the async `StateVariable` and with `BlockingStateStore`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_server import ServeProcess, api_env

from localstate import StateStore
from localstate._sync.central.central_store import CentralStore

# Any database engine made in the task process fails it: state goes through the API only.
TASK = r"""
import sqlalchemy, sqlalchemy.ext.asyncio

def refuse(*args, **kwargs):
    raise SystemExit(f"the task opened a database engine: {args!r}")

sqlalchemy.create_engine = sqlalchemy.ext.asyncio.create_async_engine = refuse

import asyncio, json, os
import localstate
from localstate import BlockingStateStore
from localstate.blocking import StateVariable

assert os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == "airflow-db-not-allowed:///"
assert "AIRFLOW__LOCALSTATE__CENTRAL_URL" not in os.environ
out = {}
# a task reads the watcher's watermark, and keeps a cursor of its own
out["watermark"] = StateVariable.get("watermark", owner="asset_watcher:orders")
StateVariable.set("cursor", out["watermark"] + 1, owner="dag:etl/load")
out["cursor"] = StateVariable.get("cursor", owner="dag:etl/load")
out["missing"] = StateVariable.get("nope", owner="dag:etl/load", default="default")
# one default store per process: the blocking one is closed before the async calls open theirs
StateVariable.default_store().close()

async def main():
    await localstate.StateVariable.set("async_cursor", 7, owner="dag:etl/load")
    out["async_cursor"] = await localstate.StateVariable.get("async_cursor", owner="dag:etl/load")
    await localstate.StateVariable.default_store().close()

asyncio.run(main())
with BlockingStateStore() as store:
    store.set("dag:etl/load", "blocking", [1, 2])
    out["cas"] = store.compare_and_set("dag:etl/load", "blocking", [3], expected_version=1)
    out["enabled"] = store.stats().cache_enabled
print(json.dumps(out))
"""


@pytest.fixture
def server(central_url: str) -> Iterator[ServeProcess]:
    proc = ServeProcess(central_url)
    proc.start()
    yield proc
    proc.stop()


def test_a_task_with_no_database_reads_and_writes_through_the_api(
        server: ServeProcess, central_url: str, tmp_path: Path) -> None:
    """In direct mode (``enabled = false``), as the README recommends for tasks: each call is
    one request and holds when it returns; no cache file on a worker that may be gone
    tomorrow, and no file lock for the several tasks (and stores) a worker host runs."""
    async def watcher_writes() -> None:  # the triggerer side, on the central DB
        async with StateStore(central_url=central_url, cache_path=tmp_path / "trig.db") as s:
            await s.set("asset_watcher:orders", "watermark", 41, durability="central")

    asyncio.run(watcher_writes())
    home = tmp_path / "task-home"
    home.mkdir()
    env = {**api_env(server.url), "AIRFLOW_HOME": str(home),
           "AIRFLOW__LOCALSTATE__ENABLED": "false"}
    env.pop("AIRFLOW_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", TASK], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"watermark": 41, "cursor": 42, "missing": "default", "async_cursor": 7,
                   "cas": 2, "enabled": False}
    # no embedded central DB and no cache file in the task's AIRFLOW_HOME: the server has it
    assert not (home / "localstate-central.db").exists()
    assert not list(home.rglob("*.db"))

    async def central() -> dict[str, str | None]:
        async with CentralStore.open(central_url) as c:
            rows = await c.read_owner("dag:etl/load")
        return {r.key: r.data for r in rows}

    assert asyncio.run(central()) == {"cursor": "42", "async_cursor": "7", "blocking": "[3]"}
