"""N watcher triggers with localstate's mixin in a real Airflow 3.3 triggerer (issue #20).

    python benches/bench_airflow_watchers.py --sink airflow [--watchers 200] [--seconds 60]
        [--batched-reads]

Starts a throwaway PostgreSQL server, ``airflow db migrate``, the dag processor and the
scheduler (until the assets are active), then ``airflow triggerer`` running `--watchers` Asset
Watchers (`airflow_watchers.WatermarkTrigger`): each sets its watermark every 0.2 s for
`--seconds` s, ``durability = local``, ``flush_interval = 1``, ``conflict_policy = max``.
Printed (and as JSON): the triggers' own ``set_watermark`` timings (p50/p99/max), their
start-up ``get_watermark`` (p50/p99/max), the store's flush lag p50/p99 and flush duration, the
whole server's commits/s while the triggers write (``pg_stat_database``), the time until every
central value equals the trigger's last one, the trigger runner's GC pauses, and the time
``airflow triggerer`` takes to exit after SIGTERM.

``--batched-reads`` (``sink = airflow``): also ``airflow api-server`` with localstate's plugin
and a read token for ``asset_watcher:`` owners, and the triggerer's ``api_url``/``api_token``
pointing at it, so the sink reads its misses there in one request per batch instead of one
``aget`` each through the supervisor (the sink's read counters are printed under ``sink``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from localstate._bench.airflow_deployment import fast_loops, localstate_api_healthy, pg_commits
from localstate._bench.percentile import percentile
from localstate._testing.postgres_server import PostgresServer

HERE = Path(__file__).resolve().parent
AIRFLOW = Path(sys.executable).with_name("airflow")
DAG = '''
from airflow.sdk import DAG, Asset, AssetWatcher, task
from airflow_watchers import WatermarkTrigger

assets = [Asset(name=f"wm_{{i}}", uri=f"wm://{{i}}", watchers=[AssetWatcher(
    name=f"w{{i}}", trigger=WatermarkTrigger(name=f"wm_{{i}}", seconds={seconds}))])
    for i in range({watchers})]

with DAG(dag_id="watermarks", schedule=assets):
    @task
    def nothing() -> None: ...
    nothing()
'''


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


def stop(proc: subprocess.Popen[bytes], wait: float = 30) -> float:
    began = time.monotonic()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return time.monotonic() - began


#: the API server's localstate token (read, asset watchers only) with --batched-reads
READ_TOKEN = "bench-asset-reader-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def central_values(sink: str, db: asyncpg.Connection, state: asyncpg.Connection
                         ) -> dict[str, int]:
    if sink == "airflow":
        rows = await db.fetch("SELECT a.name AS n, s.value FROM asset_state_store s JOIN asset a "
                              "ON a.id = s.asset_id WHERE s.key = 'watermark'")
    else:
        if not await state.fetchval("SELECT to_regclass('localstate_state') IS NOT NULL"):
            return {}
        rows = await state.fetch(
            "SELECT substr(owner, 15) AS n, value FROM localstate_state "
            "WHERE key = 'watermark'")
    return {r["n"]: int(json.loads(r["value"])) for r in rows if r["value"] is not None}


async def bench(sink: str, watchers: int, seconds: float, base: Path,
                batched_reads: bool = False) -> dict[str, Any]:
    server = PostgresServer(base / "pg")
    server.start()
    procs: list[subprocess.Popen[bytes]] = []
    results = base / "results"
    results.mkdir()
    try:
        server.create_database("airflow")
        server.create_database("state")
        dsn, state_dsn = server.dsn_for("airflow"), server.dsn_for("state")
        home, dags = base / "home", base / "dags"
        home.mkdir()
        dags.mkdir()
        (dags / "watermarks.py").write_text(DAG.format(seconds=seconds, watchers=watchers))
        port = free_port()
        api_url = f"http://127.0.0.1:{port}/localstate"
        batch_cfg = (f"api_url = {api_url}\napi_token = {READ_TOKEN}\n"
                     f"api_tokens = {READ_TOKEN}:read:asset_watcher:\n") if batched_reads else ""
        (home / "airflow.cfg").write_text(
            f"[localstate]\nsink = {sink}\ndurability = local\nflush_interval = 1\n"
            f"conflict_policy = max\ncentral_url = {state_dsn}\n{batch_cfg}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
        env.update({
            "AIRFLOW_HOME": str(home),
            "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE))
                                          if p),
            "LOCALSTATE_BENCH_RESULTS": str(results),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": dsn.replace("postgresql://",
                                                               "postgresql+psycopg://"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            **fast_loops(dags, parse_every=5),
            "PYTHONWARNINGS": "ignore",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API_AUTH__JWT_SECRET": "localstate-bench-jwt-secret-0123456789abcdef",
        })
        await asyncio.to_thread(subprocess.run, [str(AIRFLOW), "db", "migrate"], env=env,
                                check=True, capture_output=True)
        db = await asyncpg.connect(dsn)
        state = await asyncpg.connect(state_dsn)
        procs.append(start(env, base / "dag-processor.log", "dag-processor"))
        scheduler = start(env, base / "scheduler.log", "scheduler", "--skip-serve-logs")
        procs.append(scheduler)

        async def active() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM asset_active") == watchers)

        await wait_for("the assets to be active", active, 300)
        stop(scheduler)
        procs.remove(scheduler)

        async def registered() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM asset_watcher") == watchers)

        await wait_for("the watchers", registered, 120)
        stop(procs.pop())  # the dag processor: its work is done, the cores are few
        if batched_reads:
            procs.append(start(env, base / "api-server.log", "api-server", "--workers", "1"))

            async def serving() -> bool:
                # the first request opens localstate's store there: not the triggerer's cost
                return await localstate_api_healthy(api_url)

            await wait_for("localstate in the api-server", serving, 300)
        triggerer = start(env, base / "triggerer.log", "triggerer", "--skip-serve-logs")
        procs.append(triggerer)

        async def writing() -> bool:
            return len(await central_values(sink, db, state)) >= watchers // 2

        await wait_for("the watermarks to reach the central store", writing, 600)
        c0, t0 = await pg_commits(db), time.monotonic()
        await asyncio.sleep(seconds / 2)
        c1, t1 = await pg_commits(db), time.monotonic()

        async def reported() -> list[dict[str, Any]] | None:
            files = list(results.glob("*.json"))
            return [json.loads(f.read_text()) for f in files] if len(files) == watchers else None

        reports = await wait_for("every trigger's report", reported, seconds + 240)
        last = {r["name"]: r["last"] for r in reports}
        ended = max(r["finished_at"] for r in reports)

        async def caught_up() -> bool:
            got = await central_values(sink, db, state)
            return all(got.get(n, -1) >= v for n, v in last.items())

        await wait_for("the central values to catch up", caught_up, 120)
        catch_up = time.time() - ended
        stop_s = stop(triggerer)
        procs.remove(triggerer)
        await db.close()
        await state.close()
    finally:
        for proc in procs:
            stop(proc)
        server.close()
    sets = [s for r in reports for s in r["sets"]]
    gets = [r["get_s"] for r in reports]
    first = next(r for r in reports if "stats" in r)
    windows = loop_windows(reports, first)
    gc_pauses = first["gc"]
    full = [p for g, p in gc_pauses if g == 2]
    return {
        "sink": sink, "batched_reads": batched_reads, "watchers": watchers,
        "seconds": seconds, "sets": len(sets), "sink_reads": first.get("sink"),
        "set_p50_ms": 1000 * percentile(sets, 0.5), "set_p99_ms": 1000 * percentile(sets, 0.99),
        "set_max_ms": 1000 * max(sets),
        "get_p50_s": percentile(gets, 0.5), "get_p99_s": percentile(gets, 0.99),
        "get_max_s": max(gets),
        "flush_lag_p50_s": first["stats"].get("flush_lag_p50_s"),
        "flush_lag_p99_s": first["stats"].get("flush_lag_p99_s"),
        "stats": first["stats"],
        "commits_per_s": (c1 - c0) / (t1 - t0),
        "catch_up_s": catch_up,
        "gc_collections": len(gc_pauses), "gc_gen2": len(full),
        "gc_max_ms": 1000 * max((p for _, p in gc_pauses), default=0.0),
        "gc_gen2_max_ms": 1000 * max(full, default=0.0),
        "heap_objects": first.get("heap_objects"), "frozen_objects": first.get("frozen_objects"),
        "sigterm_exit_s": stop_s,
        **windows,
    }


def loop_windows(reports: list[dict[str, Any]], first: dict[str, Any]) -> dict[str, Any]:
    """Set, local-commit and loop-lag percentiles (ms) while the triggers start, and after.

    The start-up window runs from the first trigger's first set to the last trigger's first
    set: Airflow is still creating triggers on the same loop. A ``local`` set waits for the
    commit in flight (if any) and then the one carrying it, each timed as the loop sees it.

    A set's time outside any local commit (``outside_commit``) is what it waited for besides
    the commits: with a set waiting on its commit alone, that is a few turns of the loop
    (the wake-ups between and after them), never a read or a flush. Measured per set because
    the set p99 weighs commits by time: one 200 ms fsync stall holds every set made during it
    (at 1,000 sets/s, 200 of them) while it counts once among the commits.
    """
    boundary = max(r["set_at"][0] for r in reports if r["set_at"])
    begin = min(r["set_at"][0] for r in reports if r["set_at"])
    out: dict[str, Any] = {"startup_window_s": boundary - begin}
    timed = [(at, s) for r in reports for at, s in zip(r["set_at"], r["sets"], strict=True)]
    spans = sorted((end - s, end) for end, s in first["commits"])
    covered_until = spans[-1][1] if spans else 0.0
    for name, startup in (("startup", True), ("steady", False)):
        sets = [s for at, s in timed if (at <= boundary) == startup]
        outside, spanned = [], []
        for at, s in timed:
            if (at <= boundary) == startup and at + s <= covered_until:
                inside, count = commit_overlap(spans, at, at + s)
                outside.append(s - inside)
                spanned.append(count)
        commits = [s for end, s in first["commits"] if (end <= boundary) == startup]
        lags = [lag for at, lag in first["loop_lags"] if (at <= boundary) == startup]
        out[name] = {
            "sets": len(sets), "commits": len(commits),
            "set_p50_ms": 1000 * percentile(sets, 0.5), "set_p99_ms": 1000 * percentile(sets, 0.99),
            "commit_p50_ms": 1000 * percentile(commits, 0.5),
            "commit_p99_ms": 1000 * percentile(commits, 0.99),
            "commit_max_ms": 1000 * max(commits, default=float("nan")),
            "loop_lag_p50_ms": 1000 * percentile(lags, 0.5),
            "loop_lag_p99_ms": 1000 * percentile(lags, 0.99),
            "loop_lag_max_ms": 1000 * max(lags, default=float("nan")),
            "outside_commit_p50_ms": 1000 * percentile(outside, 0.5),
            "outside_commit_p99_ms": 1000 * percentile(outside, 0.99),
            "outside_commit_max_ms": 1000 * max(outside, default=float("nan")),
            "commits_spanned_p99": percentile([float(c) for c in spanned], 0.99),
            "commits_spanned_max": max(spanned, default=0),
        }
    return out


def commit_overlap(spans: list[tuple[float, float]], begin: float, end: float
                   ) -> tuple[float, int]:
    """How long [begin, end] was inside the local commits `spans` (sorted, disjoint: one
    writer commits at a time) that ended within it, and how many those are: the commits it
    waited for, the one in flight when it began and then its own. (A set resumes a loop turn
    after its commit, by when the next may have begun: that turn counts as outside.)"""
    i = max(0, bisect.bisect_right(spans, (begin, float("inf"))) - 1)
    inside, count = 0.0, 0
    while i < len(spans) and spans[i][0] < end:
        if begin < spans[i][1] <= end:
            inside += spans[i][1] - max(begin, spans[i][0])
            count += 1
        i += 1
    return inside, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sink", choices=["airflow", "sql"], default="airflow")
    parser.add_argument("--watchers", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batched-reads", action="store_true",
                        help="sink = airflow reads its misses through the plugin in "
                             "airflow api-server (started too), one request per batch")
    parser.add_argument("--keep", type=Path, default=None,
                        help="an empty folder to run in and keep (the processes' logs)")
    args = parser.parse_args()
    if args.batched_reads and args.sink != "airflow":
        parser.error("--batched-reads is for --sink airflow")
    with tempfile.TemporaryDirectory(prefix="bench-watchers-") as folder:
        base = args.keep or Path(folder)
        base.mkdir(parents=True, exist_ok=True)
        out = asyncio.run(bench(args.sink, args.watchers, args.seconds, base,
                                args.batched_reads))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
