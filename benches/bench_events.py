"""Asset events: localstate's emit (``sink = api``) against Airflow's own watcher path.

    python benches/bench_events.py [--yield-events 3000] [--emit-events 20000]
        [--paced-seconds 20] [--rate 1000] [--json docs/bench-events.json]

One deployment of real Airflow 3.3 processes on a throwaway PostgreSQL server: ``airflow
api-server`` with localstate's plugin, the dag processor and scheduler (until the watchers'
assets are active, then stopped), and ONE ``airflow triggerer`` with ``sink = api``,
``flush_interval = 1``. Three watchers (`airflow_event_triggers`) run one phase at a time:

1. ``yield``: Airflow's path, a watcher yielding `TriggerEvent`s as fast as it can (the
   supervisor commits each through ``Trigger.submit_event``);
2. ``emit``: localstate's ``self.emit(payload, watermark=n)`` as fast as it can;
3. ``paced``: ``emit`` at `--rate` events/s for `--paced-seconds`.

Measured from Airflow's ``asset_event`` table: events/s committed (count over first emit to
last row), the latency of each event (its row's ``timestamp`` minus the ``time.time()`` in its
payload) p50/p99, and whole-DB commits per event (``pg_stat_database.xact_commit`` over the
phase). Printed as a table and the ratio emit/yield; ``--json`` writes them.
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

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "support"), str(HERE)]

from airflow_api_server import MACHINE_TOKEN, new_airflow  # noqa: E402
from airflow_harness import ROOT  # noqa: E402

from localstate._bench.airflow_deployment import (  # noqa: E402
    fast_loops,
    pg_commits,
    running_watchers,
)
from localstate._bench.percentile import percentile  # noqa: E402
from localstate._testing.postgres_server import PostgresServer  # noqa: E402

FLUSH_INTERVAL = 1.0
DAG = '''
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow_event_triggers import EmitEventsTrigger, YieldEventsTrigger

phases = {phases!r}
assets = [Asset(name=label, uri=f"bench-events://{{label}}", watchers=[AssetWatcher(
    name=f"{{label}}_watcher",
    trigger=(YieldEventsTrigger if kind == "yield" else EmitEventsTrigger)(
        label=label, count=count, rate=rate))])
    for label, kind, count, rate in phases]
with DAG(dag_id="bench_events", schedule=assets, catchup=False):
    pass
'''


async def phase(db: asyncpg.Connection, go: Path, label: str, count: int,
                timeout: float) -> dict[str, Any]:
    before = await pg_commits(db)
    (go / label).touch()
    end = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < end:
        seen = int(await db.fetchval(
            "SELECT count(*) FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.name = $1", label))
        print(f"  {label}: {seen}/{count} asset events", end="\r", flush=True)
        if seen >= count:
            break
        await asyncio.sleep(0.5)
    print()
    after = await pg_commits(db)
    rows = await db.fetch(
        "SELECT extract(epoch FROM e.timestamp)::float8 AS at, "
        "(e.extra->'payload'->>'t')::float8 AS t, (e.extra->'payload'->>'n')::int AS n "
        "FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = $1", label)
    latencies = [r["at"] - r["t"] for r in rows]
    span = max(r["at"] for r in rows) - min(r["t"] for r in rows) if rows else float("nan")
    return {
        "events": len(rows), "expected": count, "distinct": len({r["n"] for r in rows}),
        "seconds": round(span, 3), "events_per_s": round(len(rows) / span, 1) if rows else 0,
        "latency_p50_s": round(percentile(latencies, 0.5), 3),
        "latency_p99_s": round(percentile(latencies, 0.99), 3),
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "db_commits": after - before,
        "db_commits_per_event": round((after - before) / max(1, len(rows)), 4),
    }


async def bench(args: argparse.Namespace, base: Path) -> dict[str, Any]:
    server = PostgresServer(base / "pg")
    server.start()
    try:
        d = new_airflow(server, base)
        dags = base / "dags"
        dags.mkdir()
        go = base / "go"
        go.mkdir()
        phases = [("yield", "yield", args.yield_events, 0.0),
                  ("emit", "emit", args.emit_events, 0.0),
                  ("paced", "emit", int(args.rate * args.paced_seconds), args.rate)]
        (dags / "bench_events_dag.py").write_text(DAG.format(phases=phases))
        d.env.update({
            "PYTHONPATH": f"{d.env['PYTHONPATH']}:{HERE}:{ROOT / 'tests' / 'support'}",
            "LOCALSTATE_BENCH_GO": str(go),
            **fast_loops(dags),
        })
        async with running_watchers(d, len(phases), token=MACHINE_TOKEN,
                                    flush_interval=FLUSH_INTERVAL) as running:
            await asyncio.sleep(3)
            results: dict[str, Any] = {}
            for label, _, n, _ in phases:
                print(f"phase {label}: {n} events", flush=True)
                results[label] = await phase(running.db, go, label, n, args.timeout)
    finally:
        server.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yield-events", type=int, default=3000)
    parser.add_argument("--emit-events", type=int, default=20000)
    parser.add_argument("--paced-seconds", type=float, default=20)
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-events-") as tmp:
        results = asyncio.run(bench(args, Path(tmp)))
    y, e, p = results["yield"], results["emit"], results["paced"]
    out = {
        "date": time.strftime("%Y-%m-%d"),
        "hardware": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}; "
                    "shared with other jobs",
        "airflow_version": __import__("airflow").__version__,
        "central_db": "PostgreSQL (throwaway server)",
        "flush_interval_s": FLUSH_INTERVAL,
        "phases": results,
        "throughput_ratio_emit_over_yield": round(e["events_per_s"] / y["events_per_s"], 1)
        if y["events_per_s"] else None,
        "paced_rate_offered": args.rate,
        "paced_latency_p99_within_goal": p["latency_p99_s"] <= FLUSH_INTERVAL + 0.5,
    }
    print(f"{'path':<28}{'events':>8}{'events/s':>10}{'p50 s':>8}{'p99 s':>8}{'commits/ev':>12}")
    for name, r in (("airflow yield", y), ("localstate emit", e),
                    (f"localstate emit @{args.rate:g}/s", p)):
        print(f"{name:<28}{r['events']:>8}{r['events_per_s']:>10}{r['latency_p50_s']:>8}"
              f"{r['latency_p99_s']:>8}{r['db_commits_per_event']:>12}")
    print(f"emit / yield throughput: {out['throughput_ratio_emit_over_yield']}x")
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
