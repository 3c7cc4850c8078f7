"""Watchers written as Airflow's docs write them, for the tests of `LocalStateBackend`.

`WATCHER` is a trigger module (``backend_watcher``): ``CountingWatcher(name)`` counts in its
asset's state with ``self.asset_state_store.aget/aset`` as fast as the triggerer answers, and,
when ``BACKEND_ACKS`` names a folder, appends each acknowledged count to ``<name>.log`` there
(one ``os.write`` per count: a SIGKILL of the triggerer loses none of the lines written).
`dag` is a DAG file giving `watchers` assets ``c0``, ``c1``, ... one such watcher each.
`Samples` reads both tables' counts, and `triggerer` gives a triggerer its own
``[localstate] triggerer_id`` (its own cache files: two triggerers on one host).
"""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg

from localstate._bench.airflow_deployment import Deployment

__all__ = ["BACKEND", "BACKEND_CFG", "WATCHER", "Samples", "dag", "owners", "triggerer"]

BACKEND = "localstate.airflow.state_backend.LocalStateBackend"
BACKEND_CFG = f"[state_store]\nbackend = {BACKEND}\n\n[localstate]\nflush_interval = 0.5\n"

WATCHER = '''
import asyncio
import os

from airflow.triggers.base import BaseEventTrigger


class CountingWatcher(BaseEventTrigger):
    def __init__(self, name):
        super().__init__()
        self.name = name

    def serialize(self):
        return ("backend_watcher.CountingWatcher", {"name": self.name})

    async def run(self):
        acks = os.environ.get("BACKEND_ACKS")
        fd = None
        if acks:
            fd = os.open(os.path.join(acks, f"{self.name}.log"),
                         os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        count = await self.asset_state_store.aget("count", default=0)
        while True:
            count += 1
            await self.asset_state_store.aset("count", count)
            if fd is not None:
                os.write(fd, f"{count}\\n".encode())
            await asyncio.sleep(0.02)
        yield  # never: no events
'''


def dag(watchers: int) -> str:
    return f'''
from airflow.sdk import DAG, Asset, AssetWatcher, task

from backend_watcher import CountingWatcher

assets = [Asset(name=f"c{{i}}", uri=f"test://c{{i}}", watchers=[
    AssetWatcher(name=f"w{{i}}", trigger=CountingWatcher(f"c{{i}}"))]) for i in range({watchers})]

with DAG("counting", schedule=assets, catchup=False):
    @task
    def noop():
        pass

    noop()
'''


def owners(watchers: int) -> list[str]:
    return [f"asset_watcher:c{i}" for i in range(watchers)]


def triggerer(d: Deployment, name: str) -> Deployment:
    """`d` for triggerer `name` (its own [localstate] triggerer_id: its own cache files)."""
    return dataclasses.replace(d, env={**d.env, "AIRFLOW__LOCALSTATE__TRIGGERER_ID": name})


class Samples:
    """Both tables' counts, read every 0.1 s on a connection of its own: per owner, the
    (localstate value, its writer) and Airflow's value."""

    def __init__(self, db: asyncpg.Connection, owner_names: list[str]) -> None:
        self.db = db
        self.central: dict[str, list[tuple[int, str]]] = {o: [] for o in owner_names}
        self.airflow: dict[str, list[int]] = {o: [] for o in owner_names}

    async def take(self) -> None:
        for row in await self.db.fetch(
                "SELECT owner, value::text AS value, updated_by FROM localstate_state "
                "WHERE key = 'count'"):
            self.central[row["owner"]].append((int(row["value"]), row["updated_by"]))
        for row in await self.db.fetch(
                "SELECT a.name, s.value FROM asset_state_store s JOIN asset a "
                "ON a.id = s.asset_id WHERE s.key = 'count'"):
            self.airflow[f"asset_watcher:{row['name']}"].append(int(row["value"]))

    async def run(self) -> None:
        while True:
            await self.take()
            await asyncio.sleep(0.1)

    def last(self, owner: str) -> tuple[int, str] | None:
        seen = self.central[owner]
        return seen[-1] if seen else None

    def assert_never_down(self) -> None:
        for owner, seen in self.central.items():
            values = [v for v, _ in seen]
            assert values == sorted(values), (owner, "a count went down in localstate's table")
            mirrored = self.airflow[owner]
            assert mirrored == sorted(mirrored), (owner, "a count went down in asset_state_store")
