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
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest
from airflow_harness import Deployment, active_watchers, stop, wait_for, watcher_deployment, within

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

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
                "SELECT to_regclass('localstate_state') IS NOT NULL")
            if not exists:  # the triggerer's store creates it when it opens
                return {}
            rows = await self.state.fetch(
                "SELECT owner, value FROM localstate_state WHERE key = $1 "
                "AND value IS NOT NULL", key)
        return {r["owner"]: int(json.loads(r["value"])) for r in rows}


@pytest.mark.parametrize("sink", ["airflow", "sql"])
async def test_sigterm_flushes_every_acknowledged_write(
    pg_server: PostgresServer, tmp_path: Path, sink: str,
) -> None:
    state_name = f"state_{os.getpid()}_{int(time.time() * 1000)}"
    pg_server.create_database(state_name)
    state_dsn = pg_server.dsn_for(state_name)
    d = watcher_deployment(
        pg_server, tmp_path, triggers=("stop_triggers", TRIGGER), dag=("counting", DAG),
        cfg=f"[localstate]\nsink = {sink}\nflush_interval = 1.0\ndurability = local\n"
            f"conflict_policy = max\ncentral_url = {state_dsn}\n")
    await within(BOUND, _scenario(d, state_dsn, sink), d)


def _triggerer(d: Deployment, host: str) -> subprocess.Popen[bytes]:
    """``airflow triggerer`` as `host` (its own cache file, as on another machine)."""
    own = dataclasses.replace(d, env={**d.env, "AIRFLOW__LOCALSTATE__TRIGGERER_ID": host})
    return own.start(f"triggerer-{host}", "triggerer", "--skip-serve-logs")


async def _scenario(d: Deployment, state_dsn: str, sink: str) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    async with active_watchers(d, WATCHERS) as airflow_db:
        state_db = await asyncpg.connect(state_dsn)
        central = Central(sink, airflow_db, state_db)
        try:
            first = _triggerer(d, "host-a")
            procs.append(first)

            async def all_flushing() -> bool:
                values = await central.values("watermark")
                return len(values) == WATCHERS and min(values.values()) > 50

            await wait_for("every watcher's watermark centrally", all_flushing, d, 90)
            await asyncio.sleep(1.5)  # writing hot, and flushed on the interval
            took = stop(first, signal.SIGTERM, 60)
            acknowledged = _local_values(d.home / "localstate" / "host-a.db", "watermark")
            flushed = await central.values("watermark")
            print(f"\nsink {sink}: SIGTERM to exit {took:.2f} s; acknowledged {acknowledged}, "
                  f"central {flushed}")
            assert len(acknowledged) == WATCHERS
            assert flushed == acknowledged, d.tail()

            # the triggers move to another triggerer (its own cache file): each resumes from the
            # value acknowledged last on the first one
            second = _triggerer(d, "host-b")
            procs.append(second)

            async def all_resumed() -> dict[str, int] | None:
                started = await central.values("started_from")
                return started if started.keys() == acknowledged.keys() and all(
                    v >= acknowledged[o] for o, v in started.items()) else None

            resumed = await wait_for("the second triggerer to resume", all_resumed, d, 90)
            assert resumed == acknowledged
            stop(second, signal.SIGTERM, 60)
            assert await central.values("watermark") == _local_values(
                d.home / "localstate" / "host-b.db", "watermark")
        finally:
            for proc in procs:
                stop(proc, signal.SIGKILL, 10)
            await state_db.close()
