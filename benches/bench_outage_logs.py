"""An API-server outage of 60 s as a real ``airflow triggerer`` with ``sink = api`` lives it:
how many WARNING lines localstate logs in the triggerer.

A fresh PostgreSQL and Airflow 3.3 deployment (the tests' harness): ``airflow db migrate``,
``airflow api-server`` with localstate's plugin and a machine token, `N` asset watchers
(`e2e_tick_trigger.TickTrigger`, each setting its watermark every `PERIOD` s) registered by
the dag processor and the scheduler, then ``airflow triggerer`` with ``sink = api`` through
the API server's ``/localstate``. Once every watermark reaches the central table the API
server is stopped for `OUTAGE` seconds and started again on the same port; the run ends when
the triggerer's log says the flushes recovered. Prints the localstate lines the triggerer
logged from the stop on (WARNING and INFO), and their counts, as JSON.

    python benches/bench_outage_logs.py [--outage 60] [--watchers 5]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from airflow_api_server import MACHINE_TOKEN, api_server, new_airflow  # noqa: E402
from airflow_harness import fast_loops, stop, wait_for  # noqa: E402

from localstate._testing.postgres_server import PostgresServer  # noqa: E402

PERIOD = 0.5
DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from e2e_tick_trigger import TickTrigger

assets = [
    Asset(name=f"tick_{{i:03d}}", uri=f"localstate-e2e://tick/{{i}}",
          watchers=[AssetWatcher(name=f"tick_{{i:03d}}_watcher",
                                 trigger=TickTrigger(index=i, period={period}))])
    for i in range({n})
]
with DAG(dag_id="localstate_ticks", schedule=assets, catchup=False):
    pass
"""
#: a line localstate logged, as the triggerer prints it (its level and logger name)
OURS = re.compile(r"localstate\.(sync|claims|local_first|airflow)")


def levelled(line: str) -> str | None:
    low = line.lower()
    for level in ("warning", "error", "info"):
        if re.search(rf"\b{level}\b", low):
            return level
    return None


async def run(outage: float, watchers: int, base: Path) -> dict[str, object]:
    pg = PostgresServer(base / "pg")
    pg.start()
    try:
        d = new_airflow(pg, base)
        dags = base / "dags"
        dags.mkdir()
        (dags / "ticks.py").write_text(DAG.format(period=PERIOD, n=watchers))
        (base / "probes").mkdir()
        d.env.update({
            "PYTHONPATH": f"{d.env['PYTHONPATH']}:{ROOT / 'tests' / 'support'}",
            **fast_loops(dags),
            "LOCALSTATE_E2E_PROBE": str(base / "probes"),
        })
        await d.run("db", "migrate")
        db = await asyncpg.connect(d.airflow_dsn)
        own = dataclasses.replace(d, env={
            **d.env, "AIRFLOW__LOCALSTATE__SINK": "api",
            "AIRFLOW__LOCALSTATE__API_URL": f"{d.env['AIRFLOW__API__BASE_URL']}/localstate",
            "AIRFLOW__LOCALSTATE__API_TOKEN": MACHINE_TOKEN,
            "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL": "1",
            "AIRFLOW__LOCALSTATE__CONFLICT_POLICY": "asset_watcher:*=max, *=reject",
            "AIRFLOW__LOCALSTATE__TRIGGERER_ID": "outage-triggerer"})
        triggerer = None
        try:
            with api_server(d):
                setup = [d.start("dag-processor", "dag-processor"),
                         d.start("scheduler", "scheduler", "--skip-serve-logs")]

                async def registered() -> bool:
                    return bool(await db.fetchval("SELECT count(*) FROM asset_watcher")
                                == watchers)

                await wait_for(f"{watchers} watchers", registered, d, 300)
                for proc in setup:
                    stop(proc)
                triggerer = own.start("triggerer", "triggerer", "--skip-serve-logs")

                async def flushing() -> bool:
                    return bool(await db.fetchval(
                        "SELECT count(*) FROM localstate_state "
                        "WHERE key = 'watermark'") == watchers)

                await wait_for("every watermark in the central table", flushing, d, 300)
                await asyncio.sleep(3)
                log = d.logs / "triggerer.log"
                mark = len(log.read_bytes())
                stopped = time.monotonic()
            # the API server is down from here
            await asyncio.sleep(outage)
            with api_server(d):
                back = time.monotonic()

                async def recovered() -> bool:
                    return "recovered after" in log.read_bytes()[mark:].decode(errors="replace")

                await wait_for("the triggerer's recovery line", recovered, d, 180)
                await asyncio.sleep(2)
                # the triggerer stops before the API server does: its lines end here
                stop(triggerer)
                triggerer = None
            lines = log.read_bytes()[mark:].decode(errors="replace").splitlines()
        finally:
            if triggerer is not None:
                stop(triggerer)
            await db.close()
    finally:
        pg.close()
    ours = [line for line in lines if OURS.search(line)]
    warnings = [line for line in ours if levelled(line) in ("warning", "error")]
    return {"outage_s": round(back - stopped, 1), "watchers": watchers,
            "warning_lines": len(warnings), "localstate_lines": ours,
            "all_warning_lines_in_triggerer_log": sum(
                1 for line in lines if levelled(line) in ("warning", "error"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outage", type=float, default=60.0)
    parser.add_argument("--watchers", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-outage-"))
    print(json.dumps(asyncio.run(run(args.outage, args.watchers, base)), indent=2))


if __name__ == "__main__":
    main()
