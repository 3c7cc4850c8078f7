"""A watermark update in a real Airflow 3.3 triggerer: Airflow's ``aset`` against localstate's.

    python benches/bench_airflow_triggerer.py [--seconds 10]

Starts a throwaway PostgreSQL server (`localstate._testing.postgres_server`), ``airflow db
migrate``, the dag processor and the scheduler (until the assets are active), then ``airflow
triggerer`` with two Asset Watchers running the same hot loop of
``await self.asset_state_store.aset(...)`` (`airflow_hot_triggers.py`): one as written for
Airflow, one with localstate's mixin (``[localstate] sink = airflow``, local durability). Both
run in the same triggerer at the same time. Printed: sets/s of each, their ratio, and the writes
each caused on Airflow's ``asset_state_store`` table (counted by a PostgreSQL trigger).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from localstate._bench.airflow_deployment import fast_loops
from localstate._testing.postgres_server import PostgresServer

HERE = Path(__file__).resolve().parent

AIRFLOW = Path(sys.executable).with_name("airflow")
DAG = '''
from airflow.sdk import DAG, Asset, AssetWatcher, task
from airflow_hot_triggers import HotAsetTrigger, LocalHotAsetTrigger

raw = Asset(name="hot_raw", watchers=[AssetWatcher(
    name="raw", trigger=HotAsetTrigger(seconds={seconds}, label="airflow"))])
local = Asset(name="hot_local", watchers=[AssetWatcher(
    name="local", trigger=LocalHotAsetTrigger(seconds={seconds}, label="localstate"))])

with DAG(dag_id="hot_aset", schedule=[raw, local]):
    @task
    def nothing() -> None: ...
    nothing()
'''
COUNT_WRITES = """
CREATE TABLE bench_writes (asset_id int PRIMARY KEY, n bigint NOT NULL);
CREATE FUNCTION bench_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO bench_writes VALUES (NEW.asset_id, 1)
      ON CONFLICT (asset_id) DO UPDATE SET n = bench_writes.n + 1; RETURN NULL; END $$;
CREATE TRIGGER bench_count AFTER INSERT OR UPDATE ON asset_state_store
FOR EACH ROW EXECUTE FUNCTION bench_count();
"""


async def wait_for(what: str, check: Any, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = await check()
        if result:
            return result
        await asyncio.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def start(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([str(AIRFLOW), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


async def bench(seconds: float, base: Path) -> dict[str, Any]:
    server = PostgresServer(base / "pg")
    server.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server.create_database("airflow")
        dsn = server.dsn_for("airflow")
        home, dags = base / "home", base / "dags"
        home.mkdir()
        dags.mkdir()
        (dags / "hot_aset.py").write_text(DAG.format(seconds=seconds))
        (home / "airflow.cfg").write_text("[localstate]\nsink = airflow\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        env.update({
            "AIRFLOW_HOME": str(home),
            "PYTHONPATH": str(HERE),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": dsn.replace("postgresql://",
                                                               "postgresql+psycopg://"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            **fast_loops(dags),
            "PYTHONWARNINGS": "ignore",
        })
        await asyncio.to_thread(subprocess.run, [str(AIRFLOW), "db", "migrate"], env=env,
                                check=True, capture_output=True)
        db = await asyncpg.connect(dsn)
        await db.execute(COUNT_WRITES)
        procs.append(start(env, base / "dag-processor.log", "dag-processor"))
        scheduler = start(env, base / "scheduler.log", "scheduler", "--skip-serve-logs")
        procs.append(scheduler)

        async def active() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM asset_active") == 2)

        await wait_for("the assets to be active", active, 120)
        stop(scheduler)

        async def watchers() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM asset_watcher") == 2)

        await wait_for("the watchers", watchers, 60)
        procs.append(start(env, base / "triggerer.log", "triggerer", "--skip-serve-logs"))

        async def reports() -> list[dict[str, Any]] | None:
            rows = await db.fetch(
                "SELECT a.name, a.id, e.extra FROM asset_event e JOIN asset a "
                "ON a.id = e.asset_id ORDER BY e.id")
            got = {r["name"]: (r["id"], json.loads(r["extra"])["payload"]) for r in rows}
            if len(got) < 2:
                return None
            await asyncio.sleep(2.5)  # localstate's last flush (flush_interval 1 s)
            writes = {r["asset_id"]: r["n"] for r in await db.fetch("SELECT * FROM bench_writes")}
            return [dict(payload, asset=name, state_store_writes=writes.get(asset_id, 0))
                    for name, (asset_id, payload) in sorted(got.items())]

        result = await wait_for("both reports", reports, seconds + 120)
        await db.close()
    finally:
        for proc in procs:
            stop(proc)
        server.close()
    by = {r["label"]: r for r in result}
    for r in result:
        r["sets_per_s"] = r["sets"] / r["seconds"]
    return {"seconds": seconds, "results": result,
            "localstate_x_airflow": by["localstate"]["sets_per_s"] / by["airflow"]["sets_per_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-airflow-") as folder:
        out = asyncio.run(bench(args.seconds, Path(folder)))
    for r in out["results"]:
        print(f"{r['label']:<11} {r['sets']:>8,} sets in {r['seconds']:.1f} s = "
              f"{r['sets_per_s']:>9,.0f}/s; asset_state_store writes: "
              f"{r['state_store_writes']:,}")
    print(f"localstate's drop-in: {out['localstate_x_airflow']:,.1f}x Airflow's own aset, "
          "same triggerer, same run")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
