"""A zombie triggerer under `LocalStateBackend`: frozen past the health threshold, resumed.

Real Airflow 3.3 processes on the suite's PostgreSQL, ``[state_store] backend`` set and
nothing else of localstate's but a short ``flush_interval``: the dag processor and scheduler
activate `WATCHERS` asset watchers (written as Airflow's docs write them, counting with
``self.asset_state_store.aget/aset`` as fast as the supervisor answers), then triggerer A runs
them. Triggerer B starts idle; A's process group is frozen (SIGSTOP) past the 4 s health
threshold, so Airflow moves the watchers to B; then A is resumed (SIGCONT) and runs on until
Airflow's assignment takes the triggers from it.

What the test checks, sampling localstate's table and Airflow's ``asset_state_store`` every
0.1 s the whole time:

* B claims every asset's owner (epoch 2) while A is still frozen, and B's counts advance
  while A is frozen: the frozen zombie does not stall the takeover;
* no stored count ever goes down, in either table;
* from B's first write on, every stored count is B's: no write of the zombie becomes the
  stored value; A's store says its writes were refused (the claim's warning in its log).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import asyncpg
import pytest
from airflow_harness import Deployment, active_watchers, stop, wait_for, watcher_deployment, within
from backend_watchers import BACKEND_CFG, WATCHER, Samples, dag, owners, triggerer

from localstate._testing.postgres_server import PostgresServer

pytestmark = pytest.mark.postgres

WATCHERS = 3
OWNERS = owners(WATCHERS)
#: the scenario, set-up included, fails after this
BOUND = 480.0


async def test_a_frozen_triggerer_is_fenced_and_does_not_stall_the_takeover(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    d = watcher_deployment(
        pg_server, tmp_path, triggers=("backend_watcher", WATCHER),
        dag=("counting_dag", dag(WATCHERS)), cfg=BACKEND_CFG)
    async with active_watchers(d, WATCHERS) as db:
        await within(BOUND, _scenario(d, db), d)


async def _scenario(d: Deployment, db: asyncpg.Connection) -> None:
    samples = Samples(await asyncpg.connect(d.airflow_dsn), OWNERS)  # a connection of its own
    sampler = asyncio.create_task(samples.run())
    a = triggerer(d, "trig-a").start("triggerer-a", "triggerer")
    b = None
    try:
        async def counting_on(name: str, at_least: dict[str, int]) -> bool:
            return all((last := samples.last(o)) is not None and last[1] == name
                       and last[0] >= at_least.get(o, 10) for o in OWNERS)

        await wait_for("A's counts", lambda: counting_on("trig-a-state-backend", {}), d, 180)
        b = triggerer(d, "trig-b").start("triggerer-b", "triggerer")
        await asyncio.sleep(3.0)  # B up and idle: Airflow leaves a healthy triggerer's triggers
        os.killpg(a.pid, signal.SIGSTOP)
        frozen_at = {o: v[0] for o in OWNERS if (v := samples.last(o)) is not None}

        async def b_claimed() -> bool:
            rows = await db.fetch("SELECT owner, epoch, claimant FROM localstate_owner_claim")
            return sorted((r["owner"], r["epoch"], r["claimant"]) for r in rows) == [
                (o, 2, "trig-b-state-backend") for o in OWNERS]

        await wait_for("B's claims while A is frozen", b_claimed, d, 120)
        claimed_at = {o: len(samples.central[o]) for o in OWNERS}
        # the new owner keeps writing while the zombie is still frozen
        await wait_for("B's counts while A is frozen", lambda: counting_on(
            "trig-b-state-backend", {o: v + 20 for o, v in frozen_at.items()}), d, 120)
        os.killpg(a.pid, signal.SIGCONT)

        async def a_refused() -> bool:
            log = (d.logs / "triggerer-a.log").read_text(errors="replace")
            return "was claimed by another writer" in log

        await wait_for("the zombie's writes refused", a_refused, d, 60)
        await asyncio.sleep(3.0)  # the zombie runs on until Airflow takes its triggers
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await samples.db.close()
        stop(a, signal.SIGKILL)
        if b is not None:
            stop(b)
    samples.assert_never_down()
    for owner in OWNERS:
        # from B's first stored write on (before it, the row is A's last flush before the
        # freeze), every stored count is B's: none of the zombie's
        writers = [w for _, w in samples.central[owner][claimed_at[owner]:]]
        first_b = writers.index("trig-b-state-backend")
        assert set(writers[first_b:]) == {"trig-b-state-backend"}, (owner, writers)
