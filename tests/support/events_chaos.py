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
with SIGCONT while they run elsewhere), restarts of the API server (SIGKILL) and, last, lost
answers (`_Run.replay`: a flush that committed events loses its answer on the way back, its
triggerer is SIGKILLed and restarted, and its outbox sends the events again). When the
feeder stops, Airflow's own ``asset_event`` table is read back: per watcher, the items it has an
event of, duplicates, items missing and events out of order.

`run` is used by tests/airflow/test_airflow_events_chaos.py (lean: a few minutes) and by
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
from answer_proxy import LostAnswerProxy
from e2e_events_trigger import item_path
from process_stacks import dump_stacks, session_locks, stack_dump_env

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
    #: lost answers (`_Run.replay`), after every other fault: each triggerer then reaches
    #: the API server through a `LostAnswerProxy`
    replays: int = 0
    #: the asset whose watcher's triggerer a zombie fault stops (None: the triggerer running
    #: the most triggers)
    zombie_of: str | None = None


@dataclass
class Scenario:
    """What the faults run against: the DAG with its watchers, how an item is produced into
    their sources, and how the ``asset_event`` rows are read back. `file_scenario` is the
    numbered files of ``e2e_events_trigger``; tests/support/queue_chaos.py has the message
    queues."""

    #: the DAG file: assets named ``emit_*`` (localstate) and ``plain_*`` (Airflow's own)
    dag: str
    #: rows of ``asset_watcher`` the DAG makes, and distinct triggers behind them
    watchers: int
    triggers: int
    #: produce item `n` (1, 2, ...) into every source
    produce: Callable[[int], Awaitable[None]]
    #: each asset's items, in the order promised, once items 1 to `fed` were produced
    expected: Callable[[int], dict[str, list[int]]]
    #: the items one event of an asset carries (its ``extra``); None: a malformed event
    items: Callable[[str, dict[str, object]], list[int] | None]
    #: the order lane of an item in an asset (events are in order within a lane); None: the
    #: source promises no order
    lane: Callable[[str, int], int | None]
    env: dict[str, str] = field(default_factory=dict)
    #: faults of the sources (a broker restart, ...), each run once, shuffled with the rest;
    #: each is given the run (`Run`: a fault may restart a triggerer while its source is down)
    source_faults: dict[str, Callable[[Run], Awaitable[None]]] = field(default_factory=dict)
    #: look up the emit watchers' missing items in localstate's tables (item n's key is "n")
    explain_missing: bool = False


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
    #: lost answers replayed: each event of the flush whose answer was lost, with the status
    #: the API server answered when the restarted triggerer sent it again
    replayed: dict[tuple[str, str], str] = field(default_factory=dict)
    replays: int = 0
    #: the source faults run (their names)
    source_faults: list[str] = field(default_factory=list)
    #: zombies during which the stopped triggerer's triggers moved to the other one
    takeovers: int = 0
    #: runs of the DAG scheduled on the emitting watchers' assets
    consumer_runs: int = 0
    #: each asset's figures
    by_asset: dict[str, Figures] = field(default_factory=dict)
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [("watcher", "fed", "events", "duplicates", "missing", "out of order",
                 "bad extra")]
        kinds = [("localstate emit", self.emit),
                 ("plain Airflow (yield, then aset)", self.plain)]
        if len(self.by_asset) > 2:  # several sources: each asset's row too
            kinds += [(f"  {name}", f) for name, f in sorted(self.by_asset.items())]
        for name, f in kinds:
            rows.append((name, str(f.fed), str(f.events), str(f.duplicates), str(f.missing),
                         str(f.out_of_order), str(f.bad_extra)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.append(f"faults: {self.kills} SIGKILLs of a triggerer, {self.zombies} zombies "
                     f"({self.takeovers} with their triggers taken over), {self.api_restarts} "
                     f"API server restarts, {self.replays} lost answers replayed "
                     f"({len(self.replayed)} events); source faults: "
                     f"{', '.join(self.source_faults) or 'none'}; "
                     f"{self.consumer_runs} consumer DAG runs; "
                     f"{self.seconds:.0f} s")
        return "\n".join(lines)


@dataclass
class _Triggerer:
    name: str
    process: subprocess.Popen[bytes]
    #: its ``TriggererJob`` row: the ``triggerer_id`` of the triggers it runs
    job_id: int


class _Run:
    def __init__(self, d: Deployment, schedule: Schedule, scenario: Scenario,
                 db: asyncpg.Connection) -> None:
        self.d = d
        self.db = db
        self.s = schedule
        self.scenario = scenario
        self.rng = random.Random(schedule.seed)
        self.fed = 0
        self.api: subprocess.Popen[bytes] | None = None
        self.triggerers: dict[str, _Triggerer] = {}
        #: each triggerer's way to the API server, when the schedule loses answers
        self.proxies: dict[str, LostAnswerProxy] = {}
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
        base = self.d.env["AIRFLOW__API__BASE_URL"]
        if self.s.replays and name not in self.proxies:
            upstream = httpx.URL(base)
            proxy = LostAnswerProxy(str(upstream.host), int(upstream.port or 80))
            await proxy.start()
            self.proxies[name] = proxy
        api_url = (self.proxies[name].url(f"{httpx.URL(base).path.rstrip('/')}/localstate")
                   if name in self.proxies else f"{base}/localstate")
        env = {
            "AIRFLOW__LOCALSTATE__SINK": "api",
            "AIRFLOW__LOCALSTATE__API_URL": api_url,
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
        period = 1 / self.s.rate
        start = time.monotonic()
        while True:
            n = self.fed + 1
            producing = asyncio.ensure_future(self.scenario.produce(n))
            try:
                await asyncio.shield(producing)
            except asyncio.CancelledError:
                # stopped mid-item: the item under way reaches its sources all the same (a
                # thread finishing a broker call), so it is waited for and counted
                await producing
                self.fed = n
                raise
            self.fed = n
            await asyncio.sleep(max(0.0, start + self.fed * period - time.monotonic()))

    # -- faults --------------------------------------------------------------------------
    async def kill(self) -> None:
        t = self.rng.choice(sorted(self.triggerers.values(), key=lambda t: t.name))
        stop(t.process, signal.SIGKILL)
        await self.start_triggerer(t.name)
        self.outcome.kills += 1
        self.note(f"SIGKILL {t.name}")

    async def zombie(self) -> None:
        """Stop the triggerer running the most triggers (or `Schedule.zombie_of`'s watcher)
        until the other one has taken them all over (past the health-check threshold), then
        let it run on: a zombie."""
        # after a SIGKILL the triggers stay on the dead triggerer's job until the threshold
        # passes: wait until a running triggerer holds them, so that there is something to
        # take over
        # (with `zombie_of`: until a running triggerer holds that asset's watcher)
        watcher = (set() if self.s.zombie_of is None
                   else set(await self.watcher_triggers(self.s.zombie_of)))
        deadline = time.monotonic() + self.s.health_threshold + 30
        while True:
            held = {t.name: await self.triggers_of(t.job_id) for t in self.triggerers.values()}
            most = max(len(h) for h in held.values())
            named = sorted(n for n, h in held.items() if h & watcher)
            if (named if watcher else most > 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        if named:  # the triggerer running that asset's watcher
            t = self.triggerers[named[0]]
        else:
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
            # where the triggerers and their sessions are: a takeover is Airflow's (the other
            # triggerer's supervisor must heartbeat and assign), so show what held it up
            for line in await session_locks(self.db):
                self.note(line)
            for other in self.triggerers.values():
                if other is not t:
                    stacks = await asyncio.to_thread(
                        dump_stacks, other.process.pid, self.d.logs / "stacks")
                    (self.d.logs / f"stacks-{other.name}-{time.time():.0f}.txt").write_text(
                        stacks)
                    self.note(f"{other.name}'s stacks: logs/stacks-{other.name}-*.txt")
            self.note(f"{t.name}'s triggers NOT taken over; jobs {jobs}; triggers "
                      + "; ".join(f"{r['id']}->{r['triggerer_id']} (heartbeat "
                                  f"{r['latest_heartbeat']}, ended {r['end_date']})"
                                  for r in where))
        # the zombie wakes while its triggers already run elsewhere
        await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        os.killpg(t.process.pid, signal.SIGCONT)
        self.outcome.zombies += 1
        self.note(f"SIGCONT {t.name}")

    async def restart_triggerer_of(self, asset: str) -> str:
        """SIGKILL the triggerer running `asset`'s watcher's trigger and restart it (same
        ``triggerer_id``); return the triggerer that runs the trigger next, once it does: the
        trigger has started again, in the restarted process or in the other one. Not counted
        as one of the schedule's kills."""
        [trigger] = set(await self.watcher_triggers(asset))

        async def holder() -> _Triggerer | None:
            job = await self.db.fetchval("SELECT triggerer_id FROM trigger WHERE id = $1",
                                         trigger)
            return next((t for t in self.triggerers.values() if t.job_id == job), None)

        deadline = time.monotonic() + self.s.health_threshold + 60
        while (t := await holder()) is None:  # after a kill: until a running one holds it
            assert time.monotonic() < deadline, f"no triggerer runs {asset}'s trigger"
            await asyncio.sleep(0.5)
        dead = t.job_id
        stop(t.process, signal.SIGKILL)
        await self.start_triggerer(t.name)
        deadline = time.monotonic() + self.s.health_threshold + 60
        while (now := await holder()) is None or now.job_id == dead:
            assert time.monotonic() < deadline, f"{asset}'s trigger did not start again"
            await asyncio.sleep(0.25)
        self.note(f"SIGKILL {t.name}, restarted: {asset}'s trigger started again in "
                  f"{now.name}")
        return now.name

    async def watcher_triggers(self, asset: str) -> list[int]:
        rows = await self.db.fetch(
            "SELECT w.trigger_id FROM asset_watcher w JOIN asset a ON a.id = w.asset_id "
            "WHERE a.name = $1", asset)
        return [r["trigger_id"] for r in rows]

    async def replay(self) -> None:
        """A flush whose answer is lost after its commit, sent again after a restart: the
        proxies hold back the answer of the next flush that commits events
        (`LostAnswerProxy.hold_next`); its triggerer is SIGKILLed and restarted with the same
        ``triggerer_id``, so its cache file's outbox sends the events again, and the API
        server finds them committed (``duplicate``). Meanwhile the other triggerers are
        stopped (SIGSTOP): the killed one's triggers come back to it, and the events go out
        again from the cache file whose claim stands, not after another triggerer took the
        owner over (which would refuse them instead)."""
        for p in self.proxies.values():
            p.hold_next()
        waits = {asyncio.ensure_future(p.wait_held()): n for n, p in self.proxies.items()}
        done, pending = await asyncio.wait(waits, timeout=4 * self.s.health_threshold + 60,
                                           return_when=asyncio.FIRST_COMPLETED)
        for p in self.proxies.values():
            p.disarm()
        for f in pending:
            f.cancel()
        assert done, "no flush committed events through the proxies: nothing to replay"
        name = sorted(waits[f] for f in done)[0]
        held = await self.proxies[name].wait_held()
        self.note(f"{name}'s flush of {len(held.events)} events committed, its answer lost")
        others = [t for n, t in self.triggerers.items() if n != name]
        for o in others:
            os.killpg(o.process.pid, signal.SIGSTOP)
        try:
            stop(self.triggerers[name].process, signal.SIGKILL)
            await self.start_triggerer(name)
            self.note(f"SIGKILL {name}, restarted; the others stopped")
            statuses = await asyncio.wait_for(self.proxies[name].wait_sent_again(held),
                                              4 * self.s.health_threshold + 120)
        finally:
            for o in others:
                os.killpg(o.process.pid, signal.SIGCONT)
        self.outcome.replays += 1
        self.outcome.replayed.update(statuses)
        self.note(f"{name} sent them again: {sorted(set(statuses.values()))}; the others "
                  "resumed")

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


def _payload_item(name: str, extra: dict[str, object]) -> list[int] | None:
    """The item of a numbered-file watcher's event: ``payload["n"]``."""
    payload = extra.get("payload")
    if not isinstance(payload, dict) or not isinstance(payload.get("n"), int):
        return None
    return [payload["n"]]


def _items(name: str, extras: list[dict[str, object]], scenario: Scenario
           ) -> tuple[list[int], int]:
    """The item numbers of one asset's events, in event order, and how many events lack
    ``from_trigger`` or an item."""
    items: list[int] = []
    bad = 0
    for extra in extras:
        got = scenario.items(name, extra) if extra.get("from_trigger") is True else None
        if got is None:
            bad += 1
            continue
        items.extend(got)
    return items, bad


def _missing(items: list[int], expected: list[int]) -> list[int]:
    """The `expected` items that `items` lacks, in order."""
    return sorted(set(expected) - set(items))


def _figures(events: dict[str, list[dict[str, object]]], expected: dict[str, list[int]],
             scenario: Scenario) -> Figures:
    f = Figures(fed=sum(len(v) for v in expected.values()))
    for name, want in expected.items():
        items, bad = _items(name, events.get(name, []), scenario)
        f.bad_extra += bad + len(set(items) - set(want))  # an item the asset should not have
        f.events += len(items)
        f.duplicates += len(items) - len(set(items))
        f.missing += len(_missing(items, want))
        lanes: dict[int, list[int]] = {}
        for n in items:
            lane = scenario.lane(name, n)
            if lane is not None:
                lanes.setdefault(lane, []).append(n)
        f.out_of_order += sum(1 for lane_items in lanes.values()
                              for a, b in itertools.pairwise(lane_items) if b < a)
    return f


def _ranges(items: list[int]) -> str:
    """``1-3, 7``: `items` (sorted) as ranges."""
    out: list[str] = []
    for _, group in itertools.groupby(enumerate(items), lambda p: p[1] - p[0]):
        run_ = [n for _, n in group]
        out.append(str(run_[0]) if len(run_) == 1 else f"{run_[0]}-{run_[-1]}")
    return ", ".join(out)


async def _where_missing(db: asyncpg.Connection, events: dict[str, list[dict[str, object]]],
                         expected: dict[str, list[int]], scenario: Scenario) -> list[str]:
    """What the central tables say of each emit watcher's missing items: the event table's
    row of each (its claim epoch, cache file, asset events), the watermark and the claim."""
    lines: list[str] = []
    for name, want in expected.items():
        missing = _missing(_items(name, events.get(name, []), scenario)[0], want)
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


def file_scenario(schedule: Schedule, source: Path) -> Scenario:
    """`schedule.watchers` watchers of each kind over numbered files (``e2e_events_trigger``):
    item n is the file ``<n>`` in every watcher's folder; each asset has every item, in order."""
    w = schedule.watchers
    folders = [source / str(i) for i in range(2 * w)]
    for f in folders:
        f.mkdir(parents=True, exist_ok=True)

    async def produce(n: int) -> None:
        for f in folders:
            item_path(f, n).touch()

    def expected(fed: int) -> dict[str, list[int]]:
        return {f"{kind}_{i}": list(range(1, fed + 1))
                for kind in ("emit", "plain") for i in range(w)}

    return Scenario(dag=DAG.format(watchers=w), watchers=2 * w, triggers=2 * w,
                    produce=produce, expected=expected, items=_payload_item,
                    lane=lambda name, n: 0, env={"LOCALSTATE_E2E_SOURCE": str(source)},
                    explain_missing=True)


async def run(pg_server: PostgresServer, tmp: Path, schedule: Schedule,
              progress: bool = False, scenario: Scenario | None = None,
              env: dict[str, str] | None = None,
              inspect: Callable[[Deployment, int], Awaitable[None]] | None = None) -> Outcome:
    """The whole scenario (default: `file_scenario`); every process it started is stopped
    when it returns. `env`: more environment of every process; `inspect`: called with the
    deployment and the items fed once the emit watchers have every event, while the
    processes still run."""
    started = time.monotonic()
    if scenario is None:
        scenario = file_scenario(schedule, tmp / "source")
    d = new_airflow(pg_server, tmp)
    dags = tmp / "dags"
    dags.mkdir()
    (dags / "events_chaos_dag.py").write_text(scenario.dag)
    d.env.update({
        **stack_dump_env(d.logs / "stacks", f"{d.env['PYTHONPATH']}:{ROOT / 'tests' / 'support'}"),
        **scenario.env,
        **fast_loops(dags, health_threshold=schedule.health_threshold, executor="LocalExecutor"),
        **(env or {}),
    })
    await d.run("db", "migrate", timeout=600)
    db = await asyncpg.connect(d.airflow_dsn)
    r = _Run(d, schedule, scenario, db)
    feeder: asyncio.Task[None] | None = None
    scheduler: subprocess.Popen[bytes] | None = None
    try:
        await r.start_api()

        async def count(table: str) -> int:
            return int(await db.fetchval(f"SELECT count(*) FROM {table}"))

        await activate_watchers(d, count, scenario.watchers)
        # the scheduler runs throughout: it queues the consumer DAG's runs from the events
        scheduler = d.start("scheduler-run", "scheduler", "--skip-serve-logs")
        for name in ("triggerer-a", "triggerer-b"):
            await r.start_triggerer(name)

        async def assigned() -> bool:
            n = await db.fetchval("SELECT count(*) FROM trigger WHERE triggerer_id IS NOT NULL")
            return bool(n >= scenario.triggers)

        await wait_until(f"{scenario.triggers} triggers running", assigned, d, 180)
        feeder = asyncio.create_task(r.feed())
        faults = (["kill"] * schedule.kills + ["zombie"] * schedule.zombies
                  + ["api"] * schedule.api_restarts + sorted(scenario.source_faults))
        r.rng.shuffle(faults)
        faults += ["replay"] * schedule.replays  # last: nothing sends their events again
        for i, fault in enumerate(faults):
            await asyncio.sleep(r.rng.uniform(*schedule.gap))
            if fault in scenario.source_faults:
                await scenario.source_faults[fault](r)
                r.outcome.source_faults.append(fault)
                r.note(fault)
            else:
                await {"kill": r.kill, "zombie": r.zombie, "api": r.restart_api,
                       "replay": r.replay}[fault]()
            if progress:
                print(f"fault {i + 1}/{len(faults)}: {r.outcome.log[-1]}", flush=True)
        await asyncio.sleep(schedule.gap[1])
        feeder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await feeder
        r.note("feeder stopped")
        want = scenario.expected(r.fed)
        emit_want = {n: v for n, v in want.items() if n.startswith("emit_")}
        plain_want = {n: v for n, v in want.items() if n.startswith("plain_")}

        # the emit watchers should get there: waited for while they make progress (a
        # watcher catching up a backlog the faults left, an SQS queue's redeliveries after
        # their visibility timeout), given up once none came for a stall's length; then
        # whatever is there counts
        stall = 4 * schedule.health_threshold + 30
        last, progress_at = -1, time.monotonic()
        while True:
            missing = _figures(await _events(db, "emit"), emit_want, scenario).missing
            if missing != last:
                last, progress_at = missing, time.monotonic()
            if missing == 0 or time.monotonic() - progress_at > stall:
                break
            await asyncio.sleep(1.0)
        r.note(f"emit watchers: {missing} items missing at the end")
        # the plain ones: until their count stops moving (or as long as the emit ones had:
        # a watcher far behind, one event every few seconds, would keep it moving for long)
        last = -1
        settle_by = time.monotonic() + 4 * schedule.health_threshold + 30
        while time.monotonic() < settle_by:
            n = sum(len(v) for v in (await _events(db, "plain")).values())
            if n == last:
                break
            last = n
            await asyncio.sleep(5)
        events = await _events(db, "emit")
        events.update(await _events(db, "plain"))
        r.outcome.emit = _figures(events, emit_want, scenario)
        r.outcome.plain = _figures(events, plain_want, scenario)
        if r.outcome.emit.missing and scenario.explain_missing:
            r.outcome.log.extend(await _where_missing(db, events, emit_want, scenario))
        r.outcome.consumer_runs = int(await db.fetchval(
            "SELECT count(*) FROM dag_run WHERE dag_id = 'localstate_events_chaos'"))
        r.outcome.by_asset = {name: _figures(events, {name: v}, scenario)
                              for name, v in want.items()}
        if inspect is not None:
            await inspect(d, r.fed)
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
        for proxy in r.proxies.values():
            await proxy.close()
        await db.close()
    r.outcome.seconds = time.monotonic() - started
    return r.outcome


#: what a source fault is given: the run, its processes and its database
Run = _Run
