"""Flush and scaling benchmark against a central DB (PostgreSQL on loopback by default).

    python benches/bench_flush.py                 # starts a throwaway PostgreSQL server
    python benches/bench_flush.py --central-url postgresql://user@host/db
    python benches/bench_flush.py --central-url sqlite:////tmp/central.db
    python benches/bench_flush.py --server mysql  # starts a throwaway MariaDB server

1. Flush of N dirty keys (1,000 / 10,000 / 100,000): seconds and rows/s (the median of
   `--rounds` flushes, each after every key was set again), next to the raw bulk upserts of the
   same number of rows measured in the same run (asyncpg `unnest` and asyncpg `executemany`;
   on MySQL an unfenced `JSON_TABLE` upsert and aiomysql's `executemany`, a multi-row
   `INSERT … VALUES … ON DUPLICATE KEY UPDATE`, both rewriting rows the table holds, as the
   flush does; sqlite3 `executemany` on SQLite), also medians.
2. Central transactions per second while the set rate grows from 1,000/s to 100,000/s over
   10,000 keys: the target shape is flat, about 1/flush_interval plus batch spills.
3. Flush lag p99 at 10,000 triggers in a hot loop (local durability).
Every figure is a ratio against a baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from localstate import StateStore
from localstate._bench import BenchConfig, run_scenario
from localstate._bench.baselines import central_bulk_upsert, flush_rows_per_s
from localstate._sync.central.central_store import CentralStore


async def _median_bulk(url: str, n: int, rounds: int, method: str) -> float:
    """Rows/s of the raw bulk upsert of `n` new rows: the median of `rounds` runs."""
    return statistics.median([
        await central_bulk_upsert(url, n, tag=f"{method[0]}{n}r{r}", method=method)
        for r in range(rounds)])


async def flush_sizes(url: str, folder: Path, sizes: list[int], dialect: str, rounds: int
                      ) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        # the "unnest" column: MySQL's one-statement form is JSON_TABLE
        unnest = await _median_bulk(url, n, rounds,
                                    "json_table" if dialect == "mysql" else "unnest")
        many = (await _median_bulk(url, n, rounds, "executemany")
                if dialect in ("postgresql", "mysql") else unnest)
        flushed, seconds = await flush_rows_per_s(url, folder, n, tag=f"s{n}", rounds=rounds)
        rows.append({"keys": n, "flush_s": seconds, "flush_rows_per_s": flushed,
                     "raw_unnest_rows_per_s": unnest, "raw_executemany_rows_per_s": many,
                     "x_unnest": flushed / unnest, "x_executemany": flushed / many})
        print(f"flush {n:>7,} keys: {seconds * 1000:8.1f} ms  {flushed:>9,.0f} rows/s  "
              f"= {flushed / unnest:.2f}x raw unnest ({unnest:,.0f}/s), "
              f"{flushed / many:.2f}x raw executemany ({many:,.0f}/s)", flush=True)
    return rows


async def txns_vs_rate(url: str, folder: Path, rates: list[int], keys: int, seconds: float,
                       flush_interval: float) -> list[dict[str, Any]]:
    rows = []
    for rate in rates:
        async with StateStore(cache_path=folder / f"rate-{rate}.db", central_url=url,
                              triggerer_id=f"rate-{rate}", flush_interval=flush_interval,
                              durability="memory") as store:
            owners = [f"bench:rate:{rate}:{i}" for i in range(keys)]
            for start in range(0, keys, 5000):
                await asyncio.gather(*(store.set(o, "watermark", 0)
                                       for o in owners[start:start + 5000]))
            await store.flush()
            sink = store.central_store
            assert sink is not None
            commits = [0]

            def on_commit(_conn: Any, commits: list[int] = commits) -> None:
                commits[0] += 1

            event.listen(sink.engine.sync_engine, "commit", on_commit)
            # pace the writes in 10 ms ticks: rate/100 sets per tick, round robin over keys
            per_tick = max(1, rate // 100)
            started = time.perf_counter()
            done = 0
            i = 0
            while (elapsed := time.perf_counter() - started) < seconds:
                target = int(rate * elapsed)
                while done < target:
                    for _ in range(min(per_tick, target - done)):
                        await store.set(owners[i % keys], "watermark", done)
                        i += 1
                        done += 1
                await asyncio.sleep(0.01)
            elapsed = time.perf_counter() - started
            event.remove(sink.engine.sync_engine, "commit", on_commit)
            row = {"rate_target": rate, "sets_per_s": done / elapsed,
                   "central_txns_per_s": commits[0] / elapsed, "central_txns": commits[0],
                   "rows_per_txn": (sink.rows_written / max(1, sink.transactions))}
            rows.append(row)
            print(f"set rate {done / elapsed:>9,.0f}/s -> {commits[0] / elapsed:5.2f} central "
                  f"txns/s ({commits[0]} in {elapsed:.1f} s)", flush=True)
    return rows


async def main_async(args: argparse.Namespace, url: str, folder: Path) -> dict[str, Any]:
    store = await CentralStore.open(url)
    await store.close()
    result: dict[str, Any] = {"central": store.url}
    result["flush"] = await flush_sizes(url, folder, args.sizes, store.dialect, args.rounds)
    result["rates"] = await txns_vs_rate(url, folder, args.rates, 10_000, args.seconds,
                                         args.flush_interval)
    cfg = BenchConfig(central_url=url, duration=args.seconds, folder=folder, progress=False,
                      flush_interval=args.flush_interval)
    lag = await run_scenario(cfg, "distinct", "local", args.lag_triggers)
    result["lag"] = lag.as_dict()
    print(f"{args.lag_triggers:,} triggers, local durability: {lag.sets_per_s:,.0f} sets/s, "
          f"flush lag p50 {lag.lag_p50_ms or 0:,.0f} ms p99 {lag.lag_p99_ms or 0:,.0f} ms "
          f"(flush_interval {args.flush_interval * 1000:.0f} ms), "
          f"{lag.central_txns_per_s:.2f} central txns/s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--central-url", help="default: start a throwaway server (--server)")
    parser.add_argument("--server", choices=["postgresql", "mysql"], default="postgresql",
                        help="the throwaway server started without --central-url")
    parser.add_argument("--sizes", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1000, 10_000, 100_000])
    parser.add_argument("--rates", type=lambda t: [int(x) for x in t.split(",")],
                        default=[1000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=5,
                        help="flushes (and raw upserts) per size; the median is printed")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--flush-interval", type=float, default=1.0)
    parser.add_argument("--lag-triggers", type=int, default=10_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ls-flush-") as tmp:
        folder = Path(tmp)
        server: Any = None
        url = args.central_url
        if url is None and args.server == "mysql":
            from localstate._testing.mysql_server import MysqlServer

            server = MysqlServer(folder / "mysql")
            server.start()
            url = server.url
        elif url is None:
            from localstate._testing.postgres_server import PostgresServer

            server = PostgresServer(folder / "pg")
            server.start()
            url = server.url
        try:
            result = asyncio.run(main_async(args, url, folder))
        finally:
            if server is not None:
                server.close()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
