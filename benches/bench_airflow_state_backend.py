"""Airflow's ``[state_store] backend``: the default one, localstate's, and the mixin, one run.

    python benches/bench_airflow_state_backend.py [--watchers 9] [--seconds 30] [--json out]

Starts a throwaway PostgreSQL server; for each variant a fresh metadata database, ``airflow
db migrate``, the dag processor and the scheduler (until the watchers are active), then ONE
``airflow triggerer`` running `--watchers` watchers of the same trigger code (each calls
``self.asset_state_store.aset`` in a loop, as fast as it answers) for `--seconds` s:

* ``default``: Airflow's own backend (``airflow.state.metastore.MetastoreBackend``);
* ``backend``: ``[state_store] backend = localstate.airflow.state_backend.LocalStateBackend``;
* ``mixin``: the same trigger class with ``StateEnabledTrigger`` mixed in, Airflow's backend.

Per variant, over the measured window (after a warm-up): ``aset``/s (from the stored counts),
and per ``aset`` the database's statements (``pg_stat_statements``, when the server has it),
commits (``pg_stat_database``), WAL bytes (``pg_current_wal_lsn``) and rows written
(inserted + updated + deleted), whoever made them; and the triggers' own ``aset`` latency
p50/p99. Ratios are against ``default`` in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from localstate._bench.airflow_deployment import (
    activate_watchers,
    fast_loops,
    new_deployment,
    stop,
    wait_until,
)
from localstate._bench.percentile import percentile
from localstate._testing.postgres_server import PostgresServer

ROOT = Path(__file__).resolve().parents[1]
BACKEND = "localstate.airflow.state_backend.LocalStateBackend"

TRIGGERS = '''
import asyncio
import os
import time

from airflow.triggers.base import BaseEventTrigger

from localstate.airflow.trigger import StateEnabledTrigger


class Counter(BaseEventTrigger):
    """Counts in its asset's state as fast as aset answers; logs each aset's latency."""

    def __init__(self, name):
        super().__init__()
        self.name = name

    def serialize(self):
        return (f"bench_state_triggers.{type(self).__name__}", {"name": self.name})

    async def run(self):
        count = await self.asset_state_store.aget("count", default=0)
        path = os.path.join(os.environ["BENCH_LATENCIES"], f"{self.name}.txt")
        pending = []
        while True:
            count += 1
            started = time.perf_counter()
            await self.asset_state_store.aset("count", count)
            pending.append(time.perf_counter() - started)
            if len(pending) >= 50:
                with open(path, "a") as out:
                    out.write("".join(f"{time.time():.3f} {x:.6f}\\n" for x in pending))
                pending = []
        yield  # never


class MixinCounter(StateEnabledTrigger, Counter):
    """The same run(), its asset_state_store served by localstate's mixin."""
'''

DAG = '''
from airflow.sdk import DAG, Asset, AssetWatcher, task

from bench_state_triggers import {cls}

assets = [Asset(name=f"b{{i}}", uri=f"bench://b{{i}}", watchers=[
    AssetWatcher(name=f"w{{i}}", trigger={cls}(f"b{{i}}"))]) for i in range({watchers})]

with DAG("bench_state", schedule=assets, catchup=False):
    @task
    def noop():
        pass

    noop()
'''

#: the stored counts: Airflow's table (default) or localstate's (backend, mixin)
COUNTS = {
    "airflow": "SELECT coalesce(sum(value::bigint), 0) FROM asset_state_store WHERE key = 'count'",
    "localstate": "SELECT coalesce(sum((value::text)::bigint), 0) FROM localstate_state "
                  "WHERE key = 'count' AND owner LIKE 'asset_watcher:%'",
}


async def _snapshot(db: asyncpg.Connection, counts: str) -> dict[str, Any]:
    stats = await db.fetchrow(
        "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS rows "
        "FROM pg_stat_database WHERE datname = current_database()")
    statements = None
    if await db.fetchval("SELECT count(*) FROM pg_extension "
                         "WHERE extname = 'pg_stat_statements'"):
        statements = await db.fetchval(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = current_database()")
    wal = await db.fetchrow("SELECT wal_fpi, wal_records FROM pg_stat_wal")
    tables = {r["relname"]: float(r["rows"]) for r in await db.fetch(
        "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del AS rows FROM pg_stat_user_tables")}
    return {"count": float(await db.fetchval(COUNTS[counts])),
            "fpi": float(wal["wal_fpi"]), "records": float(wal["wal_records"]),
            "tables": tables,
            "commits": float(stats["xact_commit"]), "rows": float(stats["rows"]),
            "wal": float(await db.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')")),
            "statements": float(statements) if statements is not None else float("nan"),
            "at": float(await db.fetchval("SELECT extract(epoch FROM clock_timestamp())"))}


async def variant(server: PostgresServer, base: Path, name: str, args: argparse.Namespace
                  ) -> dict[str, Any]:
    folder = base / name
    dags, code, latencies = folder / "dags", folder / "code", folder / "latencies"
    for f in (dags, code, latencies):
        f.mkdir(parents=True)
    (code / "bench_state_triggers.py").write_text(TRIGGERS)
    cls = "MixinCounter" if name == "mixin" else "Counter"
    (dags / "bench_state_dag.py").write_text(DAG.format(cls=cls, watchers=args.watchers))
    dbname = f"bench_{name}"
    server.create_database(dbname)
    dsn = server.dsn_for(dbname)
    central = dsn.replace("postgresql://", "postgresql+asyncpg://", 1)
    every = f"flush_interval = {args.flush_interval:g}\n"
    cfg = {"default": "",
           "backend": f"[state_store]\nbackend = {BACKEND}\n\n[localstate]\n{every}",
           "mixin": f"[localstate]\n{every}central_url = {central}\n"}[name]
    d = new_deployment(dsn, folder, cfg=cfg, pythonpath=[ROOT, code],
                       env={**fast_loops(dags), "BENCH_LATENCIES": str(latencies)})
    await d.run("db", "migrate")
    db = await asyncpg.connect(dsn)
    try:
        if server.has_pg_stat_statements:
            await db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

        async def count(table: str) -> int:
            return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

        await activate_watchers(d, count, args.watchers)
        counts = "airflow" if name == "default" else "localstate"
        triggerer = d.start("triggerer", "triggerer")
        try:
            async def counting() -> bool:
                return float(await db.fetchval(COUNTS[counts])) > 0

            await wait_until("the watchers' first counts", counting, d, 180)
            await asyncio.sleep(args.warmup)
            # every variant's window starts after a checkpoint: full-page images are paid
            # for the pages each touches in it, not for a checkpoint that fell in one's window
            await db.execute("CHECKPOINT")
            before = await _snapshot(db, counts)
            await asyncio.sleep(args.seconds)
            after = await _snapshot(db, counts)
        finally:
            stop(triggerer)
    finally:
        await db.close()
    window = (before["at"], after["at"])
    lat = [float(line.split()[1]) for f in latencies.glob("*.txt")
           for line in f.read_text().splitlines()
           if window[0] <= float(line.split()[0]) <= window[1]]
    asets = after["count"] - before["count"]
    per = {k: (after[k] - before[k]) / asets if asets else float("nan")
           for k in ("statements", "commits", "wal", "rows", "fpi", "records")}
    tables = {t: round((n - before["tables"].get(t, 0.0)) / asets, 3)
              for t, n in after["tables"].items() if asets and n > before["tables"].get(t, 0.0)}
    return {"asets": int(asets), "seconds": round(after["at"] - before["at"], 2),
            "aset_per_s": round(asets / (after["at"] - before["at"]), 1),
            "statements_per_aset": round(per["statements"], 3),
            "commits_per_aset": round(per["commits"], 3),
            "wal_bytes_per_aset": round(per["wal"], 1),
            "rows_per_aset": round(per["rows"], 3),
            "wal_records_per_aset": round(per["records"], 3),
            "full_page_images_per_aset": round(per["fpi"], 4),
            "rows_per_aset_by_table": dict(sorted(tables.items(), key=lambda kv: -kv[1])),
            "latency_p50_ms": round(percentile(lat, 0.5) * 1000, 2) if lat else None,
            "latency_p99_ms": round(percentile(lat, 0.99) * 1000, 2) if lat else None}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--watchers", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--variants", default="default,backend,mixin")
    parser.add_argument("--flush-interval", type=float, default=1.0,
                        help="[localstate] flush_interval of the backend and the mixin")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-state-backend-") as tmp:
        server = PostgresServer(Path(tmp) / "pg")
        server.start()
        try:
            results = {}
            for name in args.variants.split(","):
                print(f"== {name}", flush=True)
                results[name] = await variant(server, Path(tmp), name, args)
                print(json.dumps(results[name]), flush=True)
        finally:
            server.close()
    base = results.get("default")
    if base and base["aset_per_s"]:
        for r in results.values():
            r["aset_per_s_vs_default"] = round(r["aset_per_s"] / base["aset_per_s"], 2)
            for k in ("rows_per_aset", "wal_bytes_per_aset"):
                r[f"{k}_vs_default"] = round(r[k] / base[k], 3) if base[k] else None
    out = {"date": time.strftime("%Y-%m-%d"),
           "hardware": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}; "
                       "shared with other jobs",
           "airflow_version": __import__("airflow").__version__,
           "central_db": "PostgreSQL (throwaway server)",
           "watchers": args.watchers, "seconds": args.seconds,
           "flush_interval": args.flush_interval, "results": results}
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
