"""End to end: real Airflow 3.3 components run the example watcher with localstate.

Against the suite's PostgreSQL server: ``airflow db migrate``, then the dag processor and the
scheduler (it activates the example's asset; the triggerer's state store writes go to active
assets only; it is stopped once the asset is active so no DAG runs eat the two cores), then
``airflow triggerer`` with ``[localstate] sink = airflow`` in airflow.cfg. Rows go into the
watched table while it runs; the test checks that

* Asset events are created for the rows (each event names a batch: first..last id);
* the watermark Airflow's ``asset_state_store`` holds advances;
* far fewer writes reach ``asset_state_store`` (counted by a PostgreSQL trigger on the table)
  than the trigger made watermark updates (the version of the watermark in the local cache);
* after the triggerer's process group is SIGKILLed and a new triggerer started, no row is
  skipped, and rows are repeated only after the watermark the killed triggerer had persisted
  (the example's documented at-least-once window).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from airflow_harness import Deployment, fast_loops, new_deployment, stop, wait_for, within

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

DAG_FILE = Path(__file__).parents[2] / "localstate" / "examples" / "new_rows_dag.py"
OWNER = "asset_watcher:new_orders"
ACK_DELAY = 2.0
#: the scenario, set-up included, is stopped (and fails) after this; it takes about a minute
BOUND = 180.0

_COUNT_WRITES_SQL = """
CREATE TABLE localstate_e2e_writes (n bigint NOT NULL);
INSERT INTO localstate_e2e_writes VALUES (0);
CREATE FUNCTION localstate_e2e_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE localstate_e2e_writes SET n = n + 1; RETURN NULL; END $$;
CREATE TRIGGER localstate_e2e_count AFTER INSERT OR UPDATE ON asset_state_store
FOR EACH ROW EXECUTE FUNCTION localstate_e2e_count();
"""


@pytest.fixture
def deployment(pg_server: PostgresServer, tmp_path: Path) -> Deployment:
    source = f"source_{os.getpid()}_{time.monotonic_ns()}"
    pg_server.create_database(source)
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(DAG_FILE, dags / DAG_FILE.name)
    # localstate's section through airflow.cfg (read there through Airflow's conf)
    return new_deployment(
        pg_server, tmp_path,
        cfg="[localstate]\nsink = airflow\nflush_interval = 1.0\n"
            "conflict_policy = asset_watcher:*=max, *=reject\n",
        env={
            **fast_loops(dags, health_threshold=4, executor="LocalExecutor"),
            "LOCALSTATE_EXAMPLE_DSN": pg_server.dsn_for(source),
            "LOCALSTATE_EXAMPLE_TABLE": "orders",
            "LOCALSTATE_EXAMPLE_BATCH": "20",
            "LOCALSTATE_EXAMPLE_POLL": "0.02",
            "LOCALSTATE_EXAMPLE_ACK_DELAY": str(ACK_DELAY),
        },
    )


@pytest_asyncio.fixture
async def airflow_db(deployment: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(deployment.airflow_dsn)
    try:
        yield conn
    finally:
        await conn.close()


def _local_watermark(cache: Path) -> tuple[int, int]:
    """(value, version) of the watermark in the triggerer's local cache file."""
    with contextlib.closing(sqlite3.connect(f"file:{cache}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value, version FROM state WHERE owner = ? AND key = ?",
                         (OWNER, "watermark")).fetchone()
    assert row is not None, f"no watermark in {cache}"
    return int(json.loads(row[0])), int(row[1])


class Source:
    """The watched table, filled by the test at a steady pace."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.inserted = 0

    async def insert_for(self, seconds: float, per_second: int = 200) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            await self.conn.execute("INSERT INTO orders (amount) SELECT 1 FROM "
                                    "generate_series(1, $1)", per_second // 20)
            self.inserted += per_second // 20
            await asyncio.sleep(0.05)


async def _events(db: asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.name = 'new_orders' ORDER BY e.id")
    return [json.loads(r["extra"])["payload"] for r in rows]


async def _stored_watermark(db: asyncpg.Connection) -> int | None:
    value = await db.fetchval(
        "SELECT s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
        "WHERE a.name = 'new_orders' AND s.key = 'watermark'")
    return None if value is None else int(json.loads(value))


def _covered(events: list[dict[str, Any]]) -> dict[int, int]:
    """How many events covered each row id (ids are dense: a batch is first..last)."""
    seen: dict[int, int] = {}
    for e in events:
        for i in range(e["first"], e["last"] + 1):
            seen[i] = seen.get(i, 0) + 1
    return seen


@dataclass
class Outcome:
    total: int
    events: list[dict[str, Any]]
    writes: int
    value: int
    updates: int
    persisted: int
    emitted_before: dict[int, int]


async def test_example_watcher_in_real_airflow(deployment: Deployment,
                                               airflow_db: asyncpg.Connection) -> None:
    started = time.monotonic()
    o = await within(BOUND, _scenario(deployment, airflow_db), deployment)
    covered = _covered(o.events)
    missing = [i for i in range(1, o.total + 1) if i not in covered]
    assert not missing, f"rows never announced by an Asset event: {missing[:20]}..."
    repeated = sorted(i for i, n in covered.items() if n > 1)
    # repeats only within the at-least-once window: after the watermark the killed
    # triggerer had persisted locally, and only rows it had announced before the kill
    assert all(i > o.persisted for i in repeated), (o.persisted, repeated[:20])
    assert all(i in o.emitted_before for i in repeated)
    assert o.value == o.total
    print(f"\nrows {o.total}, asset events {len(o.events)}, repeated rows {len(repeated)} "
          f"(persisted watermark at the kill {o.persisted}); watermark updates {o.updates}, "
          f"asset_state_store writes {o.writes}; {time.monotonic() - started:.0f} s")
    assert o.writes * 5 <= o.updates, f"{o.writes} store writes for {o.updates} updates"


async def _scenario(d: Deployment, airflow_db: asyncpg.Connection) -> Outcome:
    await d.run("db", "migrate")
    await airflow_db.execute(_COUNT_WRITES_SQL)
    source_conn = await asyncpg.connect(d.env["LOCALSTATE_EXAMPLE_DSN"])
    await source_conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, amount int)")
    source = Source(source_conn)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(d.start("dag-processor", "dag-processor"))
        scheduler = d.start("scheduler", "scheduler", "--skip-serve-logs")
        procs.append(scheduler)

        async def asset_active() -> bool:
            return bool(await airflow_db.fetchval(
                "SELECT count(*) FROM asset_active WHERE name = 'new_orders'"))

        await wait_for("the scheduler to activate the asset", asset_active, d, 90)
        stop(scheduler)  # its job is done; DAG runs would only compete for the CPU

        async def watcher_registered() -> bool:
            return bool(await airflow_db.fetchval("SELECT count(*) FROM asset_watcher"))

        await wait_for("the dag processor to register the watcher", watcher_registered, d, 60)
        triggerer = d.start("triggerer-1", "triggerer", "--skip-serve-logs")
        procs.append(triggerer)

        # first run: rows arrive, events and the watermark follow
        await wait_for("the first watermark in asset_state_store",
                        lambda: _write_and_read(source, airflow_db), d, 90)
        first_stored = await _stored_watermark(airflow_db)
        await source.insert_for(5)
        await asyncio.sleep(ACK_DELAY + 1.5)  # acked and flushed
        second_stored = await _stored_watermark(airflow_db)
        assert first_stored is not None
        assert second_stored is not None
        assert second_stored > first_stored, "the watermark in Airflow's store did not advance"

        # the crash: kill the triggerer's whole process group while rows keep coming
        insert_more = asyncio.ensure_future(source.insert_for(2))
        await asyncio.sleep(1)
        stop(triggerer, signal.SIGKILL)
        await insert_more
        persisted, _ = _local_watermark(d.cache_path)
        emitted_before = _covered(await _events(airflow_db))

        triggerer2 = d.start("triggerer-2", "triggerer", "--skip-serve-logs")
        procs.append(triggerer2)
        await source.insert_for(3)
        total = source.inserted

        async def all_stored() -> bool:
            return (await _stored_watermark(airflow_db) or 0) >= total

        await wait_for(f"the stored watermark to reach row {total}", all_stored, d, 60)
        stop(triggerer2)  # SIGTERM: cleanup() flushes
        events = await _events(airflow_db)
        writes = int(await airflow_db.fetchval("SELECT n FROM localstate_e2e_writes"))
        value, updates = _local_watermark(d.cache_path)
    finally:
        for proc in procs:
            stop(proc, signal.SIGKILL, 5)
        await source_conn.close()

    return Outcome(total, events, writes, value, updates, persisted, emitted_before)


async def _write_and_read(source: Source, db: asyncpg.Connection) -> bool:
    await source.insert_for(0.5)
    return await _stored_watermark(db) is not None
