"""Crash test of `LocalStateBackend`: SIGKILLed and frozen triggerers while watchers count.

Real Airflow 3.3 processes on the suite's PostgreSQL, ``[state_store] backend`` set (and
``flush_interval = 0.5``): `WATCHERS` watchers written as Airflow's docs write them
(`backend_watchers.WATCHER`) call ``aset`` as fast as the triggerer answers, each logging the
counts it got acknowledged. Two triggerers, A and B (each its own ``triggerer_id``). Then:

* `KILLS` times, the triggerer writing ``c0`` is SIGKILLed (its whole process group) and
  started again at once; the next round waits until every count has moved on;
* twice (`FREEZES`), the triggerer writing ``c0`` is frozen (SIGSTOP) past the 4 s health
  threshold, the other triggerer takes its watchers over, then it is resumed (a zombie), and
  then SIGKILLed and restarted (a triggerer that lost an asset refuses it until it restarts).

Sampling localstate's table and Airflow's ``asset_state_store`` every 0.1 s throughout, the
test checks that no stored count ever goes down (no value goes back past one a flush
acknowledged), that in each freeze the new owner claims the moved assets and writes while the
zombie is still frozen, that none of the zombie's writes becomes the stored value, and that
the zombie's writes were refused. It prints what ``local`` durability lost: the acknowledged
counts a watcher got again after a kill or takeover (the writes its triggerer had not
flushed when it died or froze).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import asyncpg
import pytest
from airflow_harness import Deployment, active_watchers, stop, wait_for, watcher_deployment, within
from backend_watchers import BACKEND_CFG, WATCHER, Samples, dag, owners, triggerer

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

WATCHERS = 3
OWNERS = owners(WATCHERS)
KILLS = 20
#: the rounds after whose kill a freeze follows
FREEZES = (6, 13)
#: the scenario, set-up included, fails after this
BOUND = 1500.0
REFUSED = "was claimed by another writer"


class Fleet:
    """The two triggerers, restarted under the same names (their cache files)."""

    def __init__(self, d: Deployment) -> None:
        self.d = d
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, str] = {}
        self.starts = 0

    def start(self, name: str) -> None:
        self.starts += 1
        log = f"{name}-{self.starts}"
        self.logs[name] = log
        self.procs[name] = triggerer(self.d, name).start(log, "triggerer")

    def log(self, name: str) -> str:
        return (self.d.logs / f"{self.logs[name]}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop(proc, signal.SIGKILL)


def _holder(samples: Samples, owner: str) -> str:
    last = samples.last(owner)
    assert last is not None
    return last[1].removesuffix("-state-backend")


async def test_sigkills_and_zombie_takeovers_lose_no_flushed_count(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    acks = tmp_path / "acks"
    acks.mkdir()
    d = watcher_deployment(
        pg_server, tmp_path, triggers=("backend_watcher", WATCHER),
        dag=("counting_dag", dag(WATCHERS)), cfg=BACKEND_CFG, env={"BACKEND_ACKS": str(acks)})
    async with active_watchers(d, WATCHERS) as db:
        await within(BOUND, _scenario(d, db), d)
    lost = 0
    for f in sorted(acks.glob("*.log")):
        counts = Counter(int(line) for line in f.read_text().split())
        lost += sum(n - 1 for n in counts.values())
    print(f"\nacknowledged counts repeated after {KILLS} SIGKILLs and {len(FREEZES)} "
          f"takeovers of {WATCHERS} watchers (local durability, flush_interval 0.5 s): {lost}")


async def _scenario(d: Deployment, db: asyncpg.Connection) -> None:
    samples = Samples(await asyncpg.connect(d.airflow_dsn), OWNERS)
    sampler = asyncio.create_task(samples.run())
    fleet = Fleet(d)
    kills = takeovers = 0
    try:
        fleet.start("trig-a")
        fleet.start("trig-b")

        async def moved_on(past: dict[str, int], by: int, writer: str | None = None) -> bool:
            return all((last := samples.last(o)) is not None and last[0] >= past.get(o, 0) + by
                       and (writer is None or last[1] == writer) for o in past)

        await wait_for("the watchers' counts", lambda: moved_on(
            dict.fromkeys(OWNERS, 0), 10), d, 180)
        for round_ in range(KILLS):
            victim = _holder(samples, OWNERS[0])
            at_kill = {o: v[0] for o in OWNERS if (v := samples.last(o)) is not None}
            os.killpg(fleet.procs[victim].pid, signal.SIGKILL)
            fleet.procs[victim].wait(30)
            kills += 1
            fleet.start(victim)
            await wait_for(f"the counts after kill {kills}",
                           functools.partial(moved_on, at_kill, 5), d, 180)
            if round_ in FREEZES:
                zombie = await _freeze(d, db, samples, fleet)
                takeovers += 1
                # a triggerer that lost an asset refuses it until it restarts (a documented
                # limit): restart the zombie, as an operator would, before Airflow moves
                # watchers back to it
                os.killpg(fleet.procs[zombie].pid, signal.SIGKILL)
                fleet.procs[zombie].wait(30)
                kills += 1
                fleet.start(zombie)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await samples.db.close()
        fleet.stop_all()
    assert kills >= 20
    assert takeovers >= 2
    samples.assert_never_down()


async def _freeze(d: Deployment, db: asyncpg.Connection, samples: Samples,
                  fleet: Fleet) -> str:
    """Freeze the triggerer writing c0 until the other has taken its watchers over and writes
    them; resume it; check the takeover. Returns the zombie's name."""
    zombie = _holder(samples, OWNERS[0])
    other = "trig-b" if zombie == "trig-a" else "trig-a"
    moved = [o for o in OWNERS if _holder(samples, o) == zombie]
    refused_before = fleet.log(zombie).count(REFUSED)
    epochs = {r["owner"]: r["epoch"] for r in await db.fetch(
        "SELECT owner, epoch FROM localstate_owner_claim")}
    os.killpg(fleet.procs[zombie].pid, signal.SIGSTOP)
    at_freeze = {o: v[0] for o in moved if (v := samples.last(o)) is not None}
    start = {o: len(samples.central[o]) for o in moved}

    async def claimed() -> bool:
        rows = {r["owner"]: r for r in await db.fetch(
            "SELECT owner, epoch, claimant FROM localstate_owner_claim")}
        return all(rows[o]["epoch"] > epochs[o]
                   and rows[o]["claimant"] == f"{other}-state-backend" for o in moved)

    await wait_for(f"{other}'s claims while {zombie} is frozen", claimed, d, 120)

    async def writing() -> bool:
        return all((last := samples.last(o)) is not None and last[0] >= at_freeze[o] + 20
                   and last[1] == f"{other}-state-backend" for o in moved)

    await wait_for(f"{other}'s counts while {zombie} is frozen", writing, d, 120)
    os.killpg(fleet.procs[zombie].pid, signal.SIGCONT)

    async def refused() -> bool:
        return fleet.log(zombie).count(REFUSED) > refused_before

    await wait_for(f"{zombie}'s writes refused", refused, d, 60)
    await asyncio.sleep(2.0)  # the zombie runs on until Airflow takes its triggers
    for o in moved:
        writers = [w for _, w in samples.central[o][start[o]:]]
        first = writers.index(f"{other}-state-backend")
        assert set(writers[first:]) == {f"{other}-state-backend"}, (o, writers)
    return zombie
