"""Exactly-once watcher events under chaos, with real Airflow 3.3 processes on PostgreSQL.

One deployment: ``airflow api-server`` with localstate's plugin, two ``airflow triggerer``
processes with ``sink = api`` (through the plugin), and the dag processor and scheduler (they
register the asset watchers and activate their assets, then stop: the two cores go to the run).
`W` watchers of each kind (`e2e_events_trigger`) read numbered sources that a feeder fills at a
steady rate:

* ``emit`` watchers: localstate's ``self.emit(payload, watermark=n)``;
* ``plain`` watchers: Airflow's own API, yield the ``TriggerEvent``, then
  ``asset_state_store.aset`` the cursor.

Meanwhile a random schedule of faults runs: SIGKILLs of a triggerer's process group (restarted
at once, with the same ``triggerer_id``: its cache file, outbox included, is reopened), zombie
takeovers (SIGSTOP past ``[triggerer] triggerer_health_check_threshold``, so that the other
triggerer takes the triggers, then SIGCONT) and restarts of the API server (SIGKILL). When the
feeder stops, Airflow's own ``asset_event`` table is read back: per watcher, the items it has an
event of, duplicates, items missing and events out of order.

`run` is used by tests/test_airflow_events_chaos.py (lean: a few minutes) and by
benches/bench_events_chaos.py (the long variant).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from airflow_api_server import MACHINE_TOKEN, new_airflow
from airflow_harness import ROOT, Deployment, stop

from localstate.bench.airflow_deployment import activate_watchers, wait_until
from localstate.testing.postgres_server import PostgresServer

FLUSH_INTERVAL = 1.0

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher
from e2e_events_trigger import EmitSourceTrigger, PlainSourceTrigger

W = {watchers}
emit = [Asset(name=f"emit_{{i}}", uri=f"localstate-e2e://emit/{{i}}",
              watchers=[AssetWatcher(name=f"emit_{{i}}_watcher",
                                     trigger=EmitSourceTrigger(index=i))])
        for i in range(W)]
plain = [Asset(name=f"plain_{{i}}", uri=f"localstate-e2e://plain/{{i}}",
               watchers=[AssetWatcher(name=f"plain_{{i}}_watcher",
                                      trigger=PlainSourceTrigger(index=W + i))])
         for i in range(W)]
with DAG(dag_id="localstate_events_chaos", schedule=emit + plain, catchup=False):
    pass
"""


@dataclass
class Schedule:
    kills: int = 20
    zombies: int = 5
    api_restarts: int = 3
    #: seconds between two faults: uniform in this range
    gap: tuple[float, float] = (1.0, 4.0)
    #: ``[triggerer] triggerer_health_check_threshold``; a zombie is stopped this + 4 s
    health_threshold: float = 10.0
    watchers: int = 2
    #: items per second fed to each watcher's source
    rate: float = 5.0
    seed: int = 37


@dataclass
class Figures:
    """What Airflow's ``asset_event`` table holds for one kind of watcher."""

    fed: int = 0
    events: int = 0
    duplicates: int = 0
    missing: int = 0
    out_of_order: int = 0
    #: events whose ``extra`` lacks ``from_trigger`` or the item's payload
    bad_extra: int = 0


@dataclass
class Outcome:
    emit: Figures = field(default_factory=Figures)
    plain: Figures = field(default_factory=Figures)
    kills: int = 0
    zombies: int = 0
    api_restarts: int = 0
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [("watcher", "fed", "events", "duplicates", "missing", "out of order",
                 "bad extra")]
        for name, f in (("localstate emit", self.emit),
                        ("plain Airflow (yield, then aset)", self.plain)):
            rows.append((name, str(f.fed), str(f.events), str(f.duplicates), str(f.missing),
                         str(f.out_of_order), str(f.bad_extra)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.append(f"faults: {self.kills} SIGKILLs of a triggerer, {self.zombies} zombie "
                     f"takeovers, {self.api_restarts} API server restarts; {self.seconds:.0f} s")
        return "\n".join(lines)


@dataclass
class _Triggerer:
    name: str
    process: subprocess.Popen[bytes]


class _Run:
    def __init__(self, d: Deployment, schedule: Schedule, source: Path) -> None:
        self.d = d
        self.s = schedule
        self.source = source
        self.rng = random.Random(schedule.seed)
        self.fed = 0
        self.api: subprocess.Popen[bytes] | None = None
        self.triggerers: dict[str, _Triggerer] = {}
        self.outcome = Outcome()

    # -- processes -----------------------------------------------------------------------
    async def start_api(self) -> None:
        url = self.d.env["AIRFLOW__API__BASE_URL"]
        self.api = self.d.start("api-server", "api-server", "--workers", "1")
        proc = self.api

        async def healthy() -> bool:
            assert proc.poll() is None, f"the api-server exited\n{self.d.tail()}"
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                with contextlib.suppress(httpx.TransportError):
                    r = await client.get("/localstate/api/v1/health")
                    return str(r.headers.get("content-type", "")).startswith("application/json")
            return False

        await wait_until("the API server with localstate", healthy, self.d, 240)

    def start_triggerer(self, name: str) -> None:
        env = {
            "AIRFLOW__LOCALSTATE__SINK": "api",
            "AIRFLOW__LOCALSTATE__API_URL": f"{self.d.env['AIRFLOW__API__BASE_URL']}/localstate",
            "AIRFLOW__LOCALSTATE__API_TOKEN": MACHINE_TOKEN,
            "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL": str(FLUSH_INTERVAL),
            "AIRFLOW__LOCALSTATE__TRIGGERER_ID": name,
        }
        own = dataclasses.replace(self.d, env={**self.d.env, **env})
        self.triggerers[name] = _Triggerer(name, own.start(name, "triggerer",
                                                           "--skip-serve-logs"))

    # -- the source ----------------------------------------------------------------------
    async def feed(self) -> None:
        folders = [self.source / str(i) for i in range(2 * self.s.watchers)]
        for f in folders:
            f.mkdir(parents=True, exist_ok=True)
        period = 1 / self.s.rate
        start = time.monotonic()
        while True:
            self.fed += 1
            for f in folders:
                (f / f"{self.fed:08d}").touch()
            await asyncio.sleep(max(0.0, start + self.fed * period - time.monotonic()))

    # -- faults --------------------------------------------------------------------------
    async def kill(self) -> None:
        t = self.rng.choice(sorted(self.triggerers.values(), key=lambda t: t.name))
        stop(t.process, signal.SIGKILL)
        self.start_triggerer(t.name)
        self.outcome.kills += 1
        self.note(f"SIGKILL {t.name}")

    async def zombie(self) -> None:
        t = self.rng.choice(sorted(self.triggerers.values(), key=lambda t: t.name))
        os.killpg(t.process.pid, signal.SIGSTOP)
        self.note(f"SIGSTOP {t.name}")
        await asyncio.sleep(self.s.health_threshold + 4)
        os.killpg(t.process.pid, signal.SIGCONT)
        self.outcome.zombies += 1
        self.note(f"SIGCONT {t.name}")

    async def restart_api(self) -> None:
        assert self.api is not None
        stop(self.api, signal.SIGKILL)
        await self.start_api()
        self.outcome.api_restarts += 1
        self.note("API server restarted")

    def note(self, what: str) -> None:
        self.outcome.log.append(f"{time.monotonic():.1f} fed={self.fed} {what}")


async def _events(db: asyncpg.Connection, prefix: str) -> dict[str, list[dict[str, object]]]:
    rows = await db.fetch(
        "SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.name LIKE $1 ORDER BY e.id", f"{prefix}_%")
    out: dict[str, list[dict[str, object]]] = {}
    for r in rows:
        extra = r["extra"]
        out.setdefault(r["name"], []).append(
            json.loads(extra) if isinstance(extra, str) else dict(extra or {}))
    return out


def _figures(events: dict[str, list[dict[str, object]]], names: list[str], fed: int) -> Figures:
    f = Figures(fed=fed * len(names))
    for name in names:
        items: list[int] = []
        for extra in events.get(name, []):
            payload = extra.get("payload")
            if extra.get("from_trigger") is not True or not isinstance(payload, dict) \
                    or not isinstance(payload.get("n"), int):
                f.bad_extra += 1
                continue
            items.append(payload["n"])
        f.events += len(items)
        f.duplicates += len(items) - len(set(items))
        f.missing += len(set(range(1, fed + 1)) - set(items))
        f.out_of_order += sum(1 for a, b in itertools.pairwise(items) if b < a)
    return f


async def run(pg_server: PostgresServer, tmp: Path, schedule: Schedule,
              progress: bool = False) -> Outcome:
    """The whole scenario; every process it started is stopped when it returns."""
    started = time.monotonic()
    d = new_airflow(pg_server, tmp)
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "events_chaos_dag.py").write_text(DAG.format(watchers=schedule.watchers))
    source = tmp / "source"
    d.env.update({
        "PYTHONPATH": f"{d.env['PYTHONPATH']}:{ROOT / 'tests'}",
        "LOCALSTATE_E2E_SOURCE": str(source),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "2",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(schedule.health_threshold),
    })
    r = _Run(d, schedule, source)
    w = schedule.watchers
    emit_names = [f"emit_{i}" for i in range(w)]
    plain_names = [f"plain_{i}" for i in range(w)]
    await d.run("db", "migrate", timeout=600)
    db = await asyncpg.connect(d.airflow_dsn)
    feeder: asyncio.Task[None] | None = None
    try:
        await r.start_api()

        async def count(table: str) -> int:
            return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

        await activate_watchers(d, count, 2 * w)
        for name in ("triggerer-a", "triggerer-b"):
            r.start_triggerer(name)

        async def assigned() -> bool:
            n = await db.fetchval("SELECT count(*) FROM trigger WHERE triggerer_id IS NOT NULL")
            return bool(n >= 2 * w)

        await wait_until(f"{2 * w} triggers running", assigned, d, 180)
        feeder = asyncio.create_task(r.feed())
        faults = (["kill"] * schedule.kills + ["zombie"] * schedule.zombies
                  + ["api"] * schedule.api_restarts)
        r.rng.shuffle(faults)
        for i, fault in enumerate(faults):
            await asyncio.sleep(r.rng.uniform(*schedule.gap))
            await {"kill": r.kill, "zombie": r.zombie, "api": r.restart_api}[fault]()
            if progress:
                print(f"fault {i + 1}/{len(faults)}: {r.outcome.log[-1]}", flush=True)
        await asyncio.sleep(schedule.gap[1])
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        r.note("feeder stopped")
        fed = r.fed

        async def emit_complete() -> bool:
            got = _figures(await _events(db, "emit"), emit_names, fed)
            return got.missing == 0

        # the emit watchers should get there; a bounded wait, then whatever is there counts
        with contextlib.suppress(Exception):
            await wait_until("every fed item's event", emit_complete, d,
                             4 * schedule.health_threshold + 30)
        # the plain ones: until their count stops moving
        last = -1
        while True:
            n = sum(len(v) for v in (await _events(db, "plain")).values())
            if n == last:
                break
            last = n
            await asyncio.sleep(5)
        events = await _events(db, "emit")
        events.update(await _events(db, "plain"))
        r.outcome.emit = _figures(events, emit_names, fed)
        r.outcome.plain = _figures(events, plain_names, fed)
    finally:
        if feeder is not None:
            feeder.cancel()
        for t in r.triggerers.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(t.process.pid, signal.SIGCONT)
            stop(t.process)
        if r.api is not None:
            stop(r.api)
        await db.close()
    r.outcome.seconds = time.monotonic() - started
    return r.outcome
