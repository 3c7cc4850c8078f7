"""End to end, ``sink = api``: real Airflow 3.3 components, no database in the trigger runner.

On the suite's PostgreSQL: ``airflow db migrate`` (localstate's tables through the plugin's
DB manager), ``airflow api-server`` with localstate's plugin mounted at ``/localstate`` and a
machine token (``api_tokens``, read-write, ``asset_watcher:`` owners only), the dag processor
and the scheduler (they register `N` asset watchers, `e2e_tick_trigger.TickTrigger`, and
activate their assets; then they are stopped so the two cores go to what is measured), and
``airflow triggerer`` processes with ``sink = api``, ``api_url`` the API server's
``/localstate``, ``api_token`` a token of its own bound to its triggerer id (the server
records each row as written by that triggerer). Each trigger sets its watermark to the time
of the set every `PERIOD` seconds.

A deferred PostgreSQL trigger on localstate's table logs every central write at its commit
(value, writer, transaction id, ``clock_timestamp()``), so the central DB itself tells how
many transactions the flushes took, how late each value arrived and whether anything went
backwards. The scenario runs once per module (`scenario`); the tests check its parts:

* triggerer A runs all `N` triggers for `WINDOW` seconds: the central transactions of its
  writes are about one per ``flush_interval``, not one per set;
* the trigger runner holds no database: its ``sql_alchemy_conn`` is Airflow's blocked URL,
  localstate has no central URL or SQL store there, and the runner process opened no
  connection to PostgreSQL (`e2e_observe.opened_by`; the API server, checked the same way, did);
* A gets SIGTERM (triggerer B already waits): the last central value A wrote of each
  watermark is at least the one A acknowledged last (its cache file), and B resumes each
  trigger from exactly that central value;
* B gets SIGKILL (C waits): C resumes from at least what was central at the kill, and no
  central watermark ever went down;
* after C's stop, Airflow's ``asset_state_store`` row of each asset holds the central value.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from airflow_api_server import api_server, new_airflow, triggerer_token
from airflow_harness import ROOT, Deployment, fast_loops, stop, wait_for, within
from e2e_observe import (
    HISTORY_SQL,
    cached,
    central_values,
    group_pids,
    mirrored,
    opened_by,
    probes_of,
    resumed,
    version_sum,
)

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

#: watcher triggers (one asset each) and seconds between two sets of each one's watermark
N = 100
PERIOD = 0.2
FLUSH_INTERVAL = 1.0
#: seconds triggerer A runs all N triggers while the central commits are counted
WINDOW = 10.0
#: the whole scenario, set-up included, fails after this (about 2-3 minutes on 2 busy cores)
BOUND = 420.0

DAG = f"""
from airflow.sdk import DAG, Asset, AssetWatcher
from e2e_tick_trigger import TickTrigger

assets = [
    Asset(name=f"tick_{{i:03d}}", uri=f"localstate-e2e://tick/{{i}}",
          watchers=[AssetWatcher(name=f"tick_{{i:03d}}_watcher",
                                 trigger=TickTrigger(index=i, period={PERIOD}))])
    for i in range({N})
]
with DAG(dag_id="localstate_ticks", schedule=assets, catchup=False):
    pass
"""

def _owner(i: int) -> str:
    return f"asset_watcher:tick_{i:03d}"


OWNERS = [_owner(i) for i in range(N)]


@dataclass
class Triggerer:
    name: str
    process: subprocess.Popen[bytes]
    cache: Path


@dataclass
class Outcome:
    """What the scenario saw; each test asserts on a part of it."""

    #: commits of A's watermark writes in the window: (txid, commit epoch, owner, value)
    window_rows: list[tuple[int, float, str, float]] = field(default_factory=list)
    window_seconds: float = 0.0
    #: sets the triggers made in the window (their watermarks' versions in A's cache)
    window_sets: int = 0
    probes: list[dict[str, Any]] = field(default_factory=list)
    #: PostgreSQL connections the runner opened or used (see `opened_by`)
    runner_pg_connections: list[str] = field(default_factory=list)
    api_server_pg_connections: int = 0
    stop_seconds: float = 0.0
    #: from A's SIGTERM to the commit of its last flush
    stop_flush_seconds: float = 0.0
    #: after A's SIGTERM: A's cache, the central table, asset_state_store, B's resumed_from
    acked_a: dict[str, float] = field(default_factory=dict)
    #: the last central value of each watermark written by A (B writes on meanwhile)
    central_from_a: dict[str, float] = field(default_factory=dict)
    resumed_b: dict[str, float] = field(default_factory=dict)
    #: at B's SIGKILL: the central table, B's cache; C's resumed_from
    central_at_kill: dict[str, float] = field(default_factory=dict)
    cached_b: dict[str, float] = field(default_factory=dict)
    resumed_c: dict[str, float] = field(default_factory=dict)
    #: every central value of every watermark, in commit order: owner -> values
    history: dict[str, list[float]] = field(default_factory=dict)
    central_final: dict[str, float] = field(default_factory=dict)
    mirrored_final: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def scenario(pg_server: PostgresServer,
             tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    tmp = tmp_path_factory.mktemp("api-e2e")
    d = new_airflow(pg_server, tmp)
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "ticks_dag.py").write_text(DAG)
    probes = tmp / "probes"
    probes.mkdir()
    d.env.update({
        "PYTHONPATH": f"{d.env['PYTHONPATH']}:{ROOT / 'tests' / 'support'}",
        **fast_loops(dags, health_threshold=4, executor="LocalExecutor"),
    })
    return asyncio.run(within(BOUND, _scenario(d, probes), d))


def _triggerer(d: Deployment, name: str, probes: Path) -> Triggerer:
    """``airflow triggerer`` with ``sink = api`` through the API server's plugin."""
    env = {
        "AIRFLOW__LOCALSTATE__SINK": "api",
        "AIRFLOW__LOCALSTATE__API_URL": f"{d.env['AIRFLOW__API__BASE_URL']}/localstate",
        # its own token, bound to its id: the server records its rows as written by it
        "AIRFLOW__LOCALSTATE__API_TOKEN": triggerer_token(name),
        "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL": str(FLUSH_INTERVAL),
        "AIRFLOW__LOCALSTATE__CONFLICT_POLICY": "asset_watcher:*=max, *=reject",
        "AIRFLOW__LOCALSTATE__TRIGGERER_ID": name,
        "LOCALSTATE_E2E_PROBE": str(probes),
    }
    own = dataclasses.replace(d, env={**d.env, **env})
    process = own.start(name, "triggerer", "--skip-serve-logs")
    return Triggerer(name, process, d.home / "localstate" / f"{name}.db")


async def _scenario(d: Deployment, probes: Path) -> Outcome:
    o = Outcome()
    pg_port = int(d.airflow_dsn.rsplit(":", 1)[1].split("/")[0])
    await d.run("db", "migrate")
    db = await asyncpg.connect(d.airflow_dsn)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await db.execute(HISTORY_SQL)
        with api_server(d) as server:
            setup = [d.start("dag-processor", "dag-processor"),
                     d.start("scheduler", "scheduler", "--skip-serve-logs")]
            procs += setup

            async def registered() -> bool:
                active = await db.fetchval(
                    "SELECT count(*) FROM asset_active WHERE name LIKE 'tick_%'")
                watchers = await db.fetchval("SELECT count(*) FROM asset_watcher")
                return bool(active == N and watchers == N)

            await wait_for(f"{N} active assets with watchers", registered, d, 150)
            for proc in setup:  # their work is done; the cores go to what is measured
                stop(proc)

            # -- triggerer A: all N triggers, the window ------------------------------
            a = _triggerer(d, "triggerer-a", probes)
            procs.append(a.process)

            async def all_running() -> bool:
                n = await db.fetchval("SELECT count(DISTINCT owner) FROM e2e_history "
                                      "WHERE key = 'watermark' AND updated_by = $1", a.name)
                return bool(n == N)

            await wait_for(f"watermarks of all {N} triggers from {a.name}", all_running, d, 120)
            sets_before = version_sum(a.cache)
            start = await db.fetchval("SELECT clock_timestamp()")
            for _ in range(int(WINDOW)):
                await asyncio.sleep(1)
                for seen in probes_of(probes):
                    found = await opened_by(db, seen["pid"], pg_port)
                    o.runner_pg_connections += found
            end = await db.fetchval("SELECT clock_timestamp()")
            o.window_sets = version_sum(a.cache) - sets_before
            o.window_seconds = (end - start).total_seconds()
            rows = await db.fetch(
                "SELECT txid, extract(epoch FROM committed) AS at, owner, value "
                "FROM e2e_history WHERE key = 'watermark' AND updated_by = $1 "
                "AND committed BETWEEN $2 AND $3 ORDER BY seq", a.name, start, end)
            o.window_rows = [(r["txid"], float(r["at"]), r["owner"],
                              float(json.loads(r["value"]))) for r in rows]
            for pid in group_pids(server.process):
                o.api_server_pg_connections += len(await opened_by(db, pid, pg_port))

            # -- SIGTERM A; B (already up) takes the triggers over --------------------
            b = _triggerer(d, "triggerer-b", probes)
            procs.append(b.process)
            await _wait_jobs(db, d, 2)
            sigterm_at = await db.fetchval("SELECT clock_timestamp()")
            stopping = time.monotonic()
            stop(a.process, signal.SIGTERM, wait=60)
            o.stop_seconds = time.monotonic() - stopping
            o.acked_a = cached(a.cache)

            async def resumed_on_b() -> bool:
                return len(await resumed(db, b.name)) == N

            await wait_for(f"all {N} triggers resumed on {b.name}", resumed_on_b, d, 90)
            o.resumed_b = await resumed(db, b.name)
            await asyncio.sleep(3 * FLUSH_INTERVAL)

            # -- SIGKILL B; C (already up) takes the triggers over --------------------
            c = _triggerer(d, "triggerer-c", probes)
            procs.append(c.process)
            await _wait_jobs(db, d, 2)
            stop(b.process, signal.SIGKILL)
            await asyncio.sleep(0.5)  # a flush request B sent before it died is answered
            o.central_at_kill = await central_values(db)
            o.cached_b = cached(b.cache)

            async def resumed_on_c() -> bool:
                return len(await resumed(db, c.name)) == N

            await wait_for(f"all {N} triggers resumed on {c.name}", resumed_on_c, d, 90)
            o.resumed_c = await resumed(db, c.name)
            await asyncio.sleep(2 * FLUSH_INTERVAL)
            stop(c.process, signal.SIGTERM, wait=60)
            o.central_final = await central_values(db)
            o.mirrored_final = await mirrored(db)
            for r in await db.fetch("SELECT owner, value, updated_by FROM e2e_history "
                                    "WHERE key = 'watermark' ORDER BY seq"):
                value = float(json.loads(r["value"]))
                o.history.setdefault(r["owner"], []).append(value)
                if r["updated_by"] == a.name:
                    o.central_from_a[r["owner"]] = value
            last_a = await db.fetchval("SELECT max(committed) FROM e2e_history "
                                       "WHERE updated_by = $1", a.name)
            o.stop_flush_seconds = (last_a - sigterm_at).total_seconds()
    finally:
        for proc in procs:
            stop(proc, signal.SIGKILL, 5)
        await db.close()
    o.probes = probes_of(probes)
    return o


async def _wait_jobs(db: asyncpg.Connection, d: Deployment, n: int) -> None:
    async def running() -> bool:
        return bool(await db.fetchval(
            "SELECT count(*) FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
            "AND latest_heartbeat > now() - interval '3 seconds'") >= n)

    await wait_for(f"{n} live triggerers", running, d, 90)


def _lag_samples(rows: list[tuple[int, float, str, float]]) -> list[float]:
    """Seconds from each set to the commit that made it (or a later value) central.

    A commit of value v (set at time v) after the previous commit of v' carries the sets
    made in (v', v]: one every PERIOD, the last one at v.
    """
    by_owner: dict[str, list[tuple[float, float]]] = {}
    for _, at, owner, value in rows:
        by_owner.setdefault(owner, []).append((at, value))
    lags: list[float] = []
    for commits in by_owner.values():
        for (_, before), (at, value) in itertools.pairwise(commits):
            t = value
            while t > before:
                lags.append(at - t)
                t -= PERIOD
    return lags


# -- the tests: each asserts a part of the one scenario --------------------------------------


def test_one_central_transaction_per_flush_interval(scenario: Outcome) -> None:
    txids = {row[0] for row in scenario.window_rows}
    intervals = scenario.window_seconds / FLUSH_INTERVAL
    rows_per_txn = len(scenario.window_rows) / max(len(txids), 1)
    lags = sorted(_lag_samples(scenario.window_rows))
    p50 = statistics.median(lags)
    p99 = lags[int(0.99 * (len(lags) - 1))]
    print(f"\n{N} triggers, {scenario.window_sets} sets in {scenario.window_seconds:.1f} s: "
          f"{len(txids)} central transactions ({len(txids) / intervals:.2f} per flush "
          f"interval), {rows_per_txn:.0f} rows each; flush lag p50 {p50 * 1000:.0f} ms, "
          f"p99 {p99 * 1000:.0f} ms ({len(lags)} sets); SIGTERM: last flush committed after "
          f"{scenario.stop_flush_seconds:.2f} s, process gone after "
          f"{scenario.stop_seconds:.2f} s")
    assert scenario.window_sets >= 10 * len(txids), "the sets were not coalesced"
    # about one per interval: a flush may be split by a slow answer, never one per set
    assert 0.5 * intervals <= len(txids) <= 2 * intervals + 2, (len(txids), intervals)
    # every flush carries the watermarks of (nearly) all triggers at once
    assert rows_per_txn >= N / 2, rows_per_txn
    assert {row[2] for row in scenario.window_rows} == set(OWNERS)


def test_no_database_in_the_trigger_runner(scenario: Outcome) -> None:
    assert len(scenario.probes) == 3, scenario.probes  # the runner of each triggerer
    for seen in scenario.probes:
        assert seen["sql_alchemy_conn"].startswith("airflow-db-not-allowed"), seen
        assert seen["sink"] == "api", seen
        assert seen["central_url"] is None, seen
        assert seen["has_central_store"] is False, seen
    assert scenario.runner_pg_connections == []
    # the same check sees the API server's connections: it can fail
    assert scenario.api_server_pg_connections > 0


def test_sigterm_flushes_and_the_moved_trigger_resumes_from_the_last_ack(
        scenario: Outcome) -> None:
    assert set(scenario.acked_a) == set(OWNERS)
    # every acknowledged value was flushed by the stop; a set still in flight when the signal
    # came (in memory, its local commit not done, so never acknowledged) may have gone too
    for owner in OWNERS:
        assert scenario.central_from_a[owner] >= scenario.acked_a[owner], owner
    in_flight = sum(scenario.central_from_a[o] != scenario.acked_a[o] for o in OWNERS)
    print(f"\nSIGTERM: {N - in_flight} triggers' last flushed value was their last ack, "
          f"{in_flight} a set in flight at the signal")
    # B resumes every trigger from what A flushed last, nothing older
    assert scenario.resumed_b == scenario.central_from_a


def test_sigkill_resumes_from_at_least_the_last_flush_never_backwards(
        scenario: Outcome) -> None:
    assert set(scenario.resumed_c) == set(OWNERS)
    for owner in OWNERS:
        assert scenario.resumed_c[owner] >= scenario.central_at_kill[owner], owner
        assert scenario.resumed_c[owner] <= scenario.cached_b[owner], owner
    for owner, values in scenario.history.items():
        assert values == sorted(values), f"{owner} went backwards"
    assert set(scenario.central_final) == set(OWNERS)


def test_asset_state_store_carries_the_same_watermark(scenario: Outcome) -> None:
    # after the last triggerer's stop flushed: Airflow's own row of each asset
    assert scenario.mirrored_final == scenario.central_final
