"""Exactly-once watcher events under chaos, with real Airflow 3.3 processes on PostgreSQL.

One deployment: ``airflow api-server`` with localstate's plugin, two ``airflow triggerer``
processes with ``sink = api`` (through the plugin), the dag processor (until it has registered
the asset watchers, then stopped: the two cores go to the run) and the scheduler, which runs
throughout and queues the consumer DAG's runs from the emitted events.
`W` watchers of each kind (`e2e_events_trigger`) read numbered sources that a feeder fills at a
steady rate:

* ``emit`` watchers: localstate's ``self.emit(payload, watermark=n)``;
* ``plain`` watchers: Airflow's own API, yield the ``TriggerEvent``, then
  ``asset_state_store.aset`` the cursor.

Meanwhile a random schedule of faults runs: SIGKILLs of a triggerer's process group (restarted
at once, with the same ``triggerer_id``: its cache file, outbox included, is reopened), zombie
takeovers (the triggerer running the most triggers is stopped with SIGSTOP until the other one
has taken them all over, past ``[triggerer] triggerer_health_check_threshold``, then resumed
with SIGCONT while they run elsewhere) and restarts of the API server (SIGKILL). When the
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import httpx
from airflow_api_server import new_airflow, triggerer_token
from airflow_harness import ROOT, Deployment, stop

from localstate._bench.airflow_deployment import activate_watchers, fast_loops, wait_until
from localstate._testing.postgres_server import PostgresServer

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
# the consumers (Airflow registers the watchers of the assets DAGs are scheduled on)
with DAG(dag_id="localstate_events_chaos", schedule=emit, catchup=False):
    pass
with DAG(dag_id="plain_events_chaos", schedule=plain, catchup=False):
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
    #: zombies during which the stopped triggerer's triggers moved to the other one
    takeovers: int = 0
    #: runs of the DAG scheduled on the emitting watchers' assets
    consumer_runs: int = 0
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
        lines.append(f"faults: {self.kills} SIGKILLs of a triggerer, {self.zombies} zombies "
                     f"({self.takeovers} with their triggers taken over), {self.api_restarts} "
                     f"API server restarts; {self.consumer_runs} consumer DAG runs; "
                     f"{self.seconds:.0f} s")
        return "\n".join(lines)


@dataclass
class _Triggerer:
    name: str
    process: subprocess.Popen[bytes]
    #: its ``TriggererJob`` row: the ``triggerer_id`` of the triggers it runs
    job_id: int


class _Run:
    def __init__(self, d: Deployment, schedule: Schedule, source: Path,
                 db: asyncpg.Connection) -> None:
        self.d = d
        self.db = db
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

    async def start_triggerer(self, name: str) -> None:
        env = {
            "AIRFLOW__LOCALSTATE__SINK": "api",
            "AIRFLOW__LOCALSTATE__API_URL": f"{self.d.env['AIRFLOW__API__BASE_URL']}/localstate",
            "AIRFLOW__LOCALSTATE__API_TOKEN": triggerer_token(name),
            "AIRFLOW__LOCALSTATE__FLUSH_INTERVAL": str(FLUSH_INTERVAL),
            "AIRFLOW__LOCALSTATE__TRIGGERER_ID": name,
        }
        own = dataclasses.replace(self.d, env={**self.d.env, **env})
        before = await self.newest_triggerer_job()
        process = own.start(name, "triggerer", "--skip-serve-logs")

        async def registered() -> bool:
            assert process.poll() is None, f"{name} exited\n{self.d.tail()}"
            return await self.newest_triggerer_job() > before

        await wait_until(f"{name}'s triggerer job", registered, self.d, 120)
        self.triggerers[name] = _Triggerer(name, process, await self.newest_triggerer_job())

    async def newest_triggerer_job(self) -> int:
        return int(await self.db.fetchval(
            "SELECT coalesce(max(id), 0) FROM job WHERE job_type = 'TriggererJob'"))

    async def triggers_of(self, job_id: int) -> set[int]:
        rows = await self.db.fetch("SELECT id FROM trigger WHERE triggerer_id = $1", job_id)
        return {r["id"] for r in rows}

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
        await self.start_triggerer(t.name)
        self.outcome.kills += 1
        self.note(f"SIGKILL {t.name}")

    async def zombie(self) -> None:
        """Stop the triggerer running the most triggers until the other one has taken them
        all over (past the health-check threshold), then let it run on: a zombie."""
        # after a SIGKILL the triggers stay on the dead triggerer's job until the threshold
        # passes: wait until a running triggerer holds them, so that there is something to
        # take over
        deadline = time.monotonic() + self.s.health_threshold + 30
        while True:
            held = {t.name: await self.triggers_of(t.job_id) for t in self.triggerers.values()}
            most = max(len(h) for h in held.values())
            if most > 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        t = self.triggerers[self.rng.choice(sorted(n for n, h in held.items()
                                                   if len(h) == most))]
        os.killpg(t.process.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        self.note(f"SIGSTOP {t.name} running {len(held[t.name])} triggers")
        moved = False
        deadline = stopped + self.s.health_threshold + 40
        while not moved and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            rows = await self.db.fetch(
                "SELECT id, triggerer_id FROM trigger WHERE id = ANY($1::int[])",
                sorted(held[t.name]))
            moved = bool(rows) and all(
                r["triggerer_id"] is not None and r["triggerer_id"] != t.job_id for r in rows)
        if moved:
            self.outcome.takeovers += 1
            self.note(f"{t.name}'s triggers taken over {time.monotonic() - stopped:.1f} s "
                      "after its stop")
        else:
            where = await self.db.fetch(
                "SELECT t.id, t.triggerer_id, j.latest_heartbeat, j.end_date FROM trigger t "
                "LEFT JOIN job j ON j.id = t.triggerer_id ORDER BY t.id")
            jobs = {n: x.job_id for n, x in self.triggerers.items()}
            sessions = await self.db.fetch(
                "SELECT pid, state, wait_event_type, left(query, 80) AS query FROM "
                "pg_stat_activity WHERE datname = current_database() AND state <> 'idle' "
                "AND pid <> pg_backend_pid()")
            self.note("sessions: " + "; ".join(
                f"{r['pid']} {r['state']} waits {r['wait_event_type']}: {r['query']}"
                for r in sessions))
            self.note(f"{t.name}'s triggers NOT taken over; jobs {jobs}; triggers "
                      + "; ".join(f"{r['id']}->{r['triggerer_id']} (heartbeat "
                                  f"{r['latest_heartbeat']}, ended {r['end_date']})"
                                  for r in where))
        # the zombie wakes while its triggers already run elsewhere
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
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


def _items(extras: list[dict[str, object]]) -> tuple[list[int], int]:
    """The item numbers of one watcher's events, in event order, and how many events lack
    ``from_trigger`` or the item's payload."""
    items: list[int] = []
    bad = 0
    for extra in extras:
        payload = extra.get("payload")
        if extra.get("from_trigger") is not True or not isinstance(payload, dict) \
                or not isinstance(payload.get("n"), int):
            bad += 1
            continue
        items.append(payload["n"])
    return items, bad


def _missing(items: list[int], fed: int) -> list[int]:
    """The fed items (1 to `fed`) that `items` lacks, in order."""
    return sorted(set(range(1, fed + 1)) - set(items))


def _figures(events: dict[str, list[dict[str, object]]], names: list[str], fed: int) -> Figures:
    f = Figures(fed=fed * len(names))
    for name in names:
        items, bad = _items(events.get(name, []))
        f.bad_extra += bad
        f.events += len(items)
        f.duplicates += len(items) - len(set(items))
        f.missing += len(_missing(items, fed))
        f.out_of_order += sum(1 for a, b in itertools.pairwise(items) if b < a)
    return f


def _ranges(items: list[int]) -> str:
    """``1-3, 7``: `items` (sorted) as ranges."""
    out: list[str] = []
    for _, group in itertools.groupby(enumerate(items), lambda p: p[1] - p[0]):
        run_ = [n for _, n in group]
        out.append(str(run_[0]) if len(run_) == 1 else f"{run_[0]}-{run_[-1]}")
    return ", ".join(out)


async def _where_missing(db: asyncpg.Connection, events: dict[str, list[dict[str, object]]],
                         names: list[str], fed: int) -> list[str]:
    """What the central tables say of each emit watcher's missing items: the event table's
    row of each (its claim epoch, cache file, asset events), the watermark and the claim."""
    lines: list[str] = []
    for name in names:
        missing = _missing(_items(events.get(name, []))[0], fed)
        if not missing:
            continue
        owner = f"asset_watcher:{name}"
        lines.append(f"{name}: missing {_ranges(missing)}")
        rows = await db.fetch(
            "SELECT key, seq, writer, epoch, asset_events, committed_at FROM localstate_event "
            "WHERE owner = $1 AND key = ANY($2::text[]) ORDER BY seq",
            owner, [str(n) for n in missing])
        lines.extend(f"  event {dict(r)}" for r in rows)
        lines.append(f"  {len(missing) - len(rows)} missing items have no event row")
        for table in ("localstate_state", "localstate_owner_claim"):
            for r in await db.fetch(f"SELECT * FROM {table} WHERE owner = $1", owner):
                lines.append(f"  {table}: {dict(r)}")
    return lines


async def run(pg_server: PostgresServer, tmp: Path, schedule: Schedule,
              progress: bool = False, env: dict[str, str] | None = None,
              inspect: Callable[[Deployment, int], Awaitable[None]] | None = None) -> Outcome:
    """The whole scenario; every process it started is stopped when it returns. `env`: more
    environment of every process; `inspect`: called with the deployment and the items fed
    once the emit watchers have every event, while the processes still run."""
    started = time.monotonic()
    d = new_airflow(pg_server, tmp)
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "events_chaos_dag.py").write_text(DAG.format(watchers=schedule.watchers))
    source = tmp / "source"
    d.env.update({
        "PYTHONPATH": f"{d.env['PYTHONPATH']}:{ROOT / 'tests'}",
        "LOCALSTATE_E2E_SOURCE": str(source),
        **fast_loops(dags, health_threshold=schedule.health_threshold, executor="LocalExecutor"),
        **(env or {}),
    })
    w = schedule.watchers
    emit_names = [f"emit_{i}" for i in range(w)]
    plain_names = [f"plain_{i}" for i in range(w)]
    await d.run("db", "migrate", timeout=600)
    db = await asyncpg.connect(d.airflow_dsn)
    r = _Run(d, schedule, source, db)
    feeder: asyncio.Task[None] | None = None
    scheduler: subprocess.Popen[bytes] | None = None
    try:
        await r.start_api()

        async def count(table: str) -> int:
            return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

        await activate_watchers(d, count, 2 * w)
        # the scheduler runs throughout: it queues the consumer DAG's runs from the events
        scheduler = d.start("scheduler-run", "scheduler", "--skip-serve-logs")
        for name in ("triggerer-a", "triggerer-b"):
            await r.start_triggerer(name)

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
        if r.outcome.emit.missing:
            r.outcome.log.extend(await _where_missing(db, events, emit_names, fed))
        r.outcome.consumer_runs = int(await db.fetchval(
            "SELECT count(*) FROM dag_run WHERE dag_id = 'localstate_events_chaos'"))
        if inspect is not None:
            await inspect(d, fed)
    finally:
        if scheduler is not None:
            stop(scheduler)
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
