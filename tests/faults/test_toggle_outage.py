"""The cache toggled live (airflow.cfg rewritten on disk) under concurrent writers, with the
central DB down across one turn-off, on SQLite, PostgreSQL and MariaDB.

Each seed draws a schedule: the store starts with the cache on (or, one time in four, off:
direct, with no cache file yet), then 4 to 7 flips of ``enabled`` with writes between them, a
``flush_interval`` change, an invalid edit, sometimes a restart of the store, and one turn-off
made while the central DB is down (PostgreSQL and MariaDB stopped; SQLite's write lock held by
another process's transaction). Six writers, each owning six keys, set, compare-and-set and delete
in every durability meanwhile, under a conflict policy drawn per seed. The history check
(`toggle_history`): per key the versions seen never go down; after every turn-off and at the
end the central DB holds the last acknowledged value of every key; no conflict, no
`WriteRejected` or `VersionConflict` with this single writer; no error but `CentralUnavailable`,
and that only during the outage. The turn-off made during the outage must stay pending (the
store serving from its cache) until the DB is back.

``LOCALSTATE_TOGGLE_SEEDS`` (default 3 per backend) sets how many seeds run;
``LOCALSTATE_TOGGLE_SEED=<n>`` replays one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from fault_tally import FaultTally
from toggle_history import ToggleWriters, check_central

from localstate import StateStore
from localstate._stats import StoreStats
from localstate._sync.central.central_store import CentralStore
from localstate._testing.mysql_server import MysqlServer
from localstate._testing.postgres_server import PostgresServer

SEEDS = int(os.environ.get("LOCALSTATE_TOGGLE_SEEDS", "3"))
REPLAY = os.environ.get("LOCALSTATE_TOGGLE_SEED")
SWITCH_TIMEOUT = 30.0


def edit_cfg(**settings: object) -> None:
    """Rewrite airflow.cfg as editors save: a new file renamed over the old one."""
    cfg = Path(os.environ["AIRFLOW_HOME"]) / "airflow.cfg"
    body = "[core]\ndags_folder = /tmp/dags\n\n[localstate]\n" + "".join(
        f"{name} = {value}\n" for name, value in settings.items())
    tmp = cfg.with_name(f".airflow.cfg.{uuid.uuid4().hex}.tmp")
    tmp.write_text(body)
    os.replace(tmp, cfg)


async def until(done: Callable[[], bool], what: str, timeout: float = SWITCH_TIMEOUT) -> None:
    """Wait (bounded) for an effect of the watcher or the store's own tasks."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not in {timeout} s: {what}"
        await asyncio.sleep(0.02)


class Central:
    """One backend's central DB for a seed, and its outage."""

    def __init__(self, backend: str, request: pytest.FixtureRequest, tmp: Path) -> None:
        self.backend = backend
        self.server: PostgresServer | MysqlServer | None = None
        if backend == "sqlite":
            self.path = tmp / "central.db"
            self.url = f"sqlite:///{self.path}"
        else:
            self.server = request.getfixturevalue(
                "pg_server" if backend == "postgresql" else "mysql_server")
            self.url = self.server.create_database(f"tg_{uuid.uuid4().hex[:12]}")

    @contextlib.asynccontextmanager
    async def down(self) -> AsyncIterator[None]:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop, "fast")
            try:
                yield
            finally:
                await asyncio.to_thread(self.server.start)
            return
        # SQLite: another process's transaction holds the write lock for the outage. The
        # store's flushes, direct writes and compare-and-sets wait for it (busy_timeout) and
        # take nothing; reads go on (WAL). A `central` write times out (CentralUnavailable).
        blocker = sqlite3.connect(self.path, timeout=30, isolation_level=None,
                                  check_same_thread=False)
        try:
            await asyncio.to_thread(blocker.execute, "BEGIN IMMEDIATE")
            try:
                yield
            finally:
                await asyncio.to_thread(blocker.execute, "ROLLBACK")
        finally:
            blocker.close()

    async def reader(self) -> CentralStore:
        return await CentralStore.open(self.url)


async def run_seed(seed: int, backend: str, request: pytest.FixtureRequest, tmp: Path,
                   tally: FaultTally) -> str:
    rng = random.Random(seed)
    await asyncio.to_thread(tmp.mkdir, parents=True)
    central = Central(backend, request, tmp)
    policy = rng.choice(["reject", "max", "last_writer_wins"])
    flush_interval = rng.choice([0.1, 0.3, 1.0])
    # most schedules start with the cache on; some start it off (direct, no cache file yet)
    start_on = rng.random() < 0.75
    cfg: dict[str, object] = {"enabled": start_on, "flush_interval": flush_interval}
    edit_cfg(**cfg)
    options: dict[str, object] = {
        "central_url": central.url, "cache_path": tmp / "cache.db", "triggerer_id": "toggler",
        "watch_config": True, "conflict_policy": policy, "close_timeout": 1.0,
        "central_timeout": 1.0}
    conflicts: list[object] = []
    writers = ToggleWriters(
        await StateStore.open(**options, on_conflict=conflicts.append),
        rng)

    def stats() -> StoreStats:
        return writers.store.stats()

    flips = rng.randint(4, 7)
    # one of the turn-offs (the odd flips when the store starts on) is made in the outage
    outage_flip = rng.choice(range(1 if start_on else 2, flips + 1, 2))
    restart_after = rng.choice([None, *range(1, flips + 1)])
    invalid_after = rng.randint(1, flips)
    toggles = toggles_in_outage = restarts = 0
    h = writers.history

    async def check(when: str) -> None:
        await writers.paused()
        try:
            reader = await central.reader()
            try:
                n = await check_central(writers, reader, when)
            finally:
                await reader.close()
            tally.add("keys checked after turn-offs (toggle)", n)
        finally:
            writers.resume()

    try:
        await writers.more(40)
        if not start_on:
            await check("the start, cache off")
        for flip in range(1, flips + 1):
            cfg["enabled"] = enabled = not cfg["enabled"]
            if flip == outage_flip:
                assert not enabled
                with writers.outage():
                    async with central.down():
                        await writers.more(rng.randint(5, 40))
                        edit_cfg(**cfg)
                        await until(lambda: stats().cache_turning_off,
                                    "the turn-off to go pending in the outage")
                        toggles_in_outage += 1
                        await writers.more(rng.randint(5, 40))
                        # still pending: nothing is left behind while the DB is down
                        assert stats().cache_enabled
                        assert stats().cache_turning_off
                    await until(lambda: not stats().cache_enabled,
                                "the pending turn-off to finish once the DB is back")
            else:
                edit_cfg(**cfg)
                await until(lambda e=enabled: (  # type: ignore[misc]
                    stats().cache_enabled is e and not stats().cache_turning_off),
                    f"enabled={enabled} to apply")
            toggles += 1
            if not enabled:
                await check(f"turn-off {flip}")
            await writers.more(rng.randint(20, 80))
            if flip == invalid_after:  # a bad value is reported; the settings in force stay
                edit_cfg(**{**cfg, "flush_interval": "soon"})
                await until(lambda: stats().config_error is not None, "the bad edit")
                cfg["flush_interval"] = rng.choice([0.1, 0.3, 1.0])
                edit_cfg(**cfg)
                await until(lambda: stats().config_error is None
                            and writers.store.settings.flush_interval == cfg["flush_interval"],
                            "the good edit after the bad one")
            if flip == restart_after:
                await writers.paused()
                await writers.store.close()
                writers.store = await StateStore.open(
                    **options, on_conflict=conflicts.append)
                restarts += 1
                writers.resume()
                await writers.more(20)
    finally:
        await writers.stop()
        if stats().cache_enabled:
            await writers.store.flush()
        await writers.store.close()
    await check("the end")
    h.conflicts = len(conflicts)
    tally.add("toggles made (toggle)", toggles)
    tally.add("toggles made during outages", toggles_in_outage)
    tally.add("store restarts (toggle)", restarts)
    tally.add("operations checked (toggle)", h.ops)
    tally.found("toggle: version regressions", len(h.regressions))
    tally.found("toggle: keys behind after a turn-off", len(h.behind))
    tally.found("toggle: single-writer conflicts and rejections", h.conflicts + sum(
        1 for what, _ in h.errors if what in ("WriteRejected", "VersionConflict")))
    tally.found("toggle: errors outside the documented ones", len(h.errors))
    problems = [
        f"{what}: {n}" for what, n in (
            ("version regressions", h.regressions[:5]), ("behind", h.behind[:5]),
            ("errors", h.errors[:5]), ("conflicts", conflicts[:5])) if n]
    assert not problems, f"seed {seed} ({backend}, {policy}): " + "; ".join(problems)
    return (f"seed {seed}: {policy}, started {'on' if start_on else 'off'}, {toggles} toggles "
            f"({toggles_in_outage} in the outage), "
            f"{restarts} restarts, {h.ops} ops ({h.sets} sets, {h.compare_and_sets} CAS, "
            f"{h.deletes} deletes), {h.unavailable} CentralUnavailable in the outage, "
            f"{h.checks} central checks")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mysql"])
async def test_live_toggles_with_an_outage_across_a_turn_off_keep_every_promise(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, fault_tally: FaultTally,
) -> None:
    seeds = ([int(REPLAY)] if REPLAY is not None
             else [random.randrange(2**32) for _ in range(SEEDS)])
    started = time.monotonic()
    lines = []
    for i, seed in enumerate(seeds):
        lines.append(await run_seed(seed, backend, request, tmp_path / f"s{i}", fault_tally))
    print(f"\ntoggle history on {backend}: {len(seeds)} seeds in "
          f"{time.monotonic() - started:.1f} s\n  " + "\n  ".join(lines))
