"""A trigger that opens a store of its own and never closes it does not hold up its triggerer's
stop, and what it was told is written stays in its cache file, for the next open to flush.

Real Airflow 3.3 components on the suite's PostgreSQL, as in
tests/airflow/test_airflow_graceful_stop.py: ``airflow db migrate``, the dag processor and the
scheduler until the watched assets are active, then ``airflow triggerer`` running `WATCHERS`
Asset Watchers whose trigger (`TRIGGER`) opens a `StateStore` of its own (not the triggerer's
default store, which localstate's graceful stop closes) and counts up in ``memory``
durability, with a 30 s window: nothing it writes is committed to its cache file by the
writer's window before the stop. Each write the store acknowledged is appended to a file.

The triggerer's process group gets SIGTERM. Its trigger runner ends its event loop with the
stores open: the runner must exit on the first signal its supervisor sends (the supervisor's
log says "Process exited" with SIGINT, never "did not terminate in time"), each cache file must
hold a count at least the last one acknowledged, and the next store to open the file flushes it
to the central DB. Airflow ends its runner and task processes with ``os._exit`` (after the
``atexit`` hooks registered in them), so they never waited for aiosqlite's thread; what they
lost was the open memory window: before the loop's end closed the caches, these files held no
count at all after the stop.

The same for async tasks (`TASK_DAG`), run by the scheduler's LocalExecutor through a real
``airflow api-server``: one raises before it closes its store, one returns without closing it.
Airflow runs an async task with ``loop.run_until_complete`` and closes the loop, which cancels
nothing: the task process's exit closes the caches (`localstate._cache.left_open`). Each task's
process (titled ``airflow worker -- <ti id>``) must be gone once its task instance has ended,
its cache file must hold every write it acknowledged, ``memory`` ones included, and the next
open flushes them.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import asyncpg
import psutil
import pytest
from airflow_api_server import api_server, new_airflow
from airflow_harness import Deployment, active_watchers, stop, wait_for, watcher_deployment, within

from localstate import StateStore
from localstate._bench.airflow_deployment import fast_loops
from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

WATCHERS = 2
BOUND = 420.0

TRIGGER = '''
from __future__ import annotations

import asyncio
import os
from typing import Any

from airflow.triggers.base import BaseEventTrigger

from localstate import StateStore


class LeftOpenTrigger(BaseEventTrigger):
    """Opens a store of its own, never closes it, counts up in memory durability."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("left_open_triggers.LeftOpenTrigger", {"name": self.name})

    async def run(self):
        folder = os.environ["LEFT_OPEN_DIR"]
        store = await StateStore.open(
            cache_path=f"{folder}/{self.name}.db", central_url=f"sqlite:///{folder}/central.db",
            triggerer_id=self.name, memory_window=30.0, flush_interval=600.0)
        n = 0
        with open(f"{folder}/{self.name}.acks", "a") as acks:
            while True:
                n += 1
                await store.set(self.name, "n", n, durability="memory")
                acks.write(f"{n}\\n")
                acks.flush()
                await asyncio.sleep(0.005)
        yield  # an async generator, as Airflow wants
'''

DAG = f'''
from airflow.sdk import DAG, Asset, AssetWatcher, task
from left_open_triggers import LeftOpenTrigger

assets = [Asset(name=f"left_open_{{i}}", uri=f"left-open://{{i}}", watchers=[AssetWatcher(
    name=f"w{{i}}", trigger=LeftOpenTrigger(name=f"left_open_{{i}}"))]) for i in range({WATCHERS})]

with DAG(dag_id="left_open", schedule=assets):
    @task
    def nothing() -> None: ...
    nothing()
'''


def _acknowledged(folder: Path, name: str) -> int:
    acks = (folder / f"{name}.acks").read_text().split()
    return int(acks[-1]) if acks else 0


def _in_file(cache: Path, owner: str) -> int | None:
    with contextlib.closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM state WHERE owner = ? AND key = 'n'",
                         (owner,)).fetchone()
    return None if row is None else int(json.loads(row[0]))


async def test_a_trigger_that_never_closes_its_store_lets_the_runner_stop(
    pg_server: PostgresServer, tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    d = watcher_deployment(
        pg_server, tmp_path, triggers=("left_open_triggers", TRIGGER), dag=("left_open", DAG),
        env={"LEFT_OPEN_DIR": str(state), "PYTHONWARNINGS": "ignore,always::ResourceWarning"})
    await within(BOUND, _scenario(d, state), d)


async def _scenario(d: Deployment, state: Path) -> None:
    triggerer: subprocess.Popen[bytes] | None = None
    names = [f"left_open_{i}" for i in range(WATCHERS)]
    async with active_watchers(d, WATCHERS):
        try:
            triggerer = d.start("triggerer", "triggerer", "--skip-serve-logs")

            async def all_counting() -> bool:
                return all((state / f"{n}.acks").exists() and _acknowledged(state, n) > 100
                           for n in names)

            await wait_for("every trigger to count", all_counting, d, 90)
            # nothing is in the files yet: the 30 s memory window has not passed
            assert all(_in_file(state / f"{n}.db", n) is None for n in names)
            took = stop(triggerer, signal.SIGTERM, 60)
            log = (d.logs / "triggerer.log").read_text(errors="replace")
            acknowledged = {n: _acknowledged(state, n) for n in names}
            in_file = {n: _in_file(state / f"{n}.db", n) for n in names}
            print(f"\nSIGTERM to exit {took:.2f} s; acknowledged {acknowledged}, in the cache "
                  f"files {in_file}")
            # the runner exits on the supervisor's first signal: no escalation. (The time to exit
            # varies: when the runner's sockets close just before it can be reaped, the supervisor
            # waits out the rest of that signal's escalation delay, 10 s, before it notices.)
            assert "did not terminate in time" not in log, d.tail()
            assert re.search(r"Process exited .*signal_sent=SIGINT", log), d.tail()
            for name in names:
                value = in_file[name]
                assert value is not None, d.tail()
                assert value >= acknowledged[name]  # the last acknowledged count, or one after it
                assert f"the local cache {state / name}.db was never closed" in log
            # the next open of each file flushes it to the central DB
            for name in names:
                async with StateStore(cache_path=state / f"{name}.db", triggerer_id=name,
                                      central_url=f"sqlite:///{state}/central.db") as store:
                    await store.flush()
                    record = await store.read_committed(name, "n")
                assert record is not None
                assert record.value == in_file[name]
        finally:
            if triggerer is not None:
                stop(triggerer, signal.SIGKILL, 10)


WRITES = 50

TASK_DAG = f'''
import asyncio, os, time
from airflow.sdk import DAG, task

async def write(name):
    from localstate import StateStore
    folder = os.environ["LEFT_OPEN_DIR"]
    store = await StateStore.open(
        cache_path=f"{{folder}}/{{name}}.db", central_url=f"sqlite:///{{folder}}/central.db",
        triggerer_id=name, memory_window=30.0, flush_interval=600.0)
    await store.set(name, "k0", 0)
    for i in range(1, {WRITES}):
        await store.set(name, f"k{{i}}", i, durability="memory")
    with open(f"{{folder}}/{{name}}.ended", "w") as ended:
        ended.write(str(time.time()))

with DAG(dag_id="left_open_task", schedule=None, default_args={{"retries": 0}}):
    @task
    async def raises():
        await write("raises")
        raise RuntimeError("user code failed before close()")

    @task
    async def returns():
        await write("returns")

    raises()
    returns()
'''


async def test_async_tasks_that_never_close_their_store_end_and_lose_nothing(
    pg_server: PostgresServer, tmp_path: Path,
) -> None:
    dags, state = tmp_path / "dags", tmp_path / "state"
    for folder in (dags, state):
        folder.mkdir()
    (dags / "left_open_task.py").write_text(TASK_DAG)
    d = new_airflow(pg_server, tmp_path)
    d.env.update({**fast_loops(dags, executor="LocalExecutor"), "LEFT_OPEN_DIR": str(state),
                  "PYTHONWARNINGS": "ignore,always::ResourceWarning"})
    await within(BOUND, _task_scenario(d, state), d)


def _running(ti_id: str) -> bool:
    """Whether a task process of that task instance is alive."""
    title = f"airflow worker -- {ti_id}"
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if title in " ".join(proc.info["cmdline"] or ()) and proc.status() != "zombie":
                return True
    return False


async def _task_scenario(d: Deployment, state: Path) -> None:
    await d.run("db", "migrate")
    db = await asyncpg.connect(d.airflow_dsn)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with api_server(d):
            procs += [d.start("dag-processor", "dag-processor"),
                      d.start("scheduler", "scheduler", "--skip-serve-logs")]

            async def parsed() -> bool:
                return bool(await db.fetchval(
                    "SELECT count(*) FROM dag WHERE dag_id = 'left_open_task'"))

            await wait_for("the DAG to be parsed", parsed, d, 150)
            await d.run("dags", "trigger", "left_open_task")

            async def ended() -> dict[str, tuple[str, str]] | None:
                rows = await db.fetch(
                    "SELECT task_id, state, id::text AS id FROM task_instance "
                    "WHERE dag_id = 'left_open_task'")
                states = {r["task_id"]: (r["state"], r["id"]) for r in rows}
                done = len(states) == 2 and all(
                    s in ("success", "failed") for s, _ in states.values())
                return states if done else None

            states = await wait_for("both tasks to end", ended, d, 240)
            assert states["raises"][0] == "failed", d.tail()
            assert states["returns"][0] == "success", d.tail()

            async def processes_gone() -> bool:
                return not any(_running(ti_id) for _, ti_id in states.values())

            await wait_for("the task processes to exit", processes_gone, d, 60)
            gone = time.time()
        for name in ("raises", "returns"):
            took = gone - float((state / f"{name}.ended").read_text())
            print(f"\n{name}: its process gone {took:.2f} s (at most) after its code ended")
        task_logs = "\n".join(p.read_text(errors="replace")
                              for p in (d.logs / "airflow").rglob("*") if p.is_file())
        for name in ("raises", "returns"):
            cache = state / f"{name}.db"
            with contextlib.closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as f:
                rows = dict(f.execute("SELECT key, value FROM state WHERE owner = ?", (name,)))
            expected = {f"k{i}": i for i in range(WRITES)}
            assert {k: json.loads(v) for k, v in rows.items()} == expected, d.tail()
            assert f"the local cache {cache} was never closed" in task_logs
            async with StateStore(cache_path=cache, triggerer_id=name,
                                  central_url=f"sqlite:///{state}/central.db") as store:
                await store.flush()
                committed = {k: await store.read_committed(name, k) for k in expected}
            assert {k: r.value for k, r in committed.items() if r is not None} == expected
    finally:
        for proc in procs:
            stop(proc, signal.SIGKILL, 10)
        await db.close()
