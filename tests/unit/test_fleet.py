"""The fleet table (`localstate._sync.central.fleet`) on every backend, and its views: the REST
API's ``GET /api/v1/fleet`` and ``localstate status --fleet``. (The UI:
tests/integration/test_ui_browser.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from conftest import StoreFactory
from localstate_cli import ok, run
from statement_log import StatementLog
from test_api import client_for

from localstate import Settings, StateStore
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow
from localstate._sync.central.central_store import CentralStore
from localstate._sync.central.fleet import (
    STALE_INTERVALS,
    FleetStatus,
    fleet_summary,
    lag_and_backlog,
)
from localstate._sync.central.schema import HISTORY_TABLE
from localstate._sync.flush.budget import FlushBudget
from localstate.api import create_app


@pytest_asyncio.fixture
async def central(central_url: str) -> AsyncIterator[CentralStore]:
    store = await CentralStore.open(central_url)
    try:
        yield store
    finally:
        await store.close()


async def record_stale(central: CentralStore, triggerer: str, *, ago: float) -> None:
    """A fleet row of a triggerer whose last flush was `ago` seconds ago (interval 1 s)."""
    at = time.time() - ago
    central.note_fleet(FleetStatus(triggerer, "elsewhere", 4242, at, 17, at - 2.0, 3.5, 1.0))
    await central.write_batch([DirtyRow("o", "k", "1", 1, 0, at, triggerer)], PolicyMap())


async def test_each_flush_records_its_triggerer_in_the_same_transaction(
        open_store: StoreFactory, central: CentralStore, central_url: str) -> None:
    store: StateStore = await open_store(triggerer_id="fleet-a", central_thread=False)
    before = time.time()
    for i in range(50):
        await store.set("asset_watcher:f", f"k{i}", i)
    oldest = min(e.updated_at for e in store.entry_table.entries.values())
    with StatementLog(store).watching() as log:
        await store.flush()
    # one transaction; on PostgreSQL the fleet row (and the watermarks' history rows) ride in
    # the upsert statement itself; elsewhere the history rows are a statement of their own
    assert log.commits == 1
    writes = [s for s, _ in log.statements if s.lstrip().upper().startswith(("INSERT", "WITH"))]
    assert len(writes) == (1 if central_url.startswith("postgresql") else 3)
    assert sum(HISTORY_TABLE in s.split("(", 1)[0] for s in writes) == (
        0 if central_url.startswith("postgresql") else 1)
    assert len(log.of_kind("INSERT")) == 1  # the state's upsert, as before
    [row] = await central.read_fleet()
    # the 50 keys go out in this flush: nothing is left waiting behind them
    assert (row.triggerer, row.pid, row.dirty_keys) == ("fleet-a", os.getpid(), 0)
    assert row.host
    assert before <= row.flushed_at <= time.time()
    assert row.oldest_unflushed is not None
    assert abs(row.oldest_unflushed - oldest) < 0.01
    assert row.flush_interval == 60.0
    assert row.rows_per_s == 0.0  # no earlier flush to measure from
    await store.set("asset_watcher:f", "k0", -1)
    await store.flush()
    [row] = await central.read_fleet()
    assert row.dirty_keys == 0
    assert row.rows_per_s > 0  # the first flush's 50 rows over the time to the second


def test_the_view_tells_idle_from_stalled() -> None:
    """An old last flush that left nothing waiting is idle (it had nothing to write); one that
    left keys waiting is stalled, the only kind flagged."""
    now = 1000.0
    old = now - 1.0 - STALE_INTERVALS * 2.0
    rows = [FleetStatus("fresh", "h", 1, now - 1.0, 3, now - 1.5, 10.0, 1.0),
            FleetStatus("idle", "h", 2, old, 0, None, 0.0, 2.0),
            FleetStatus("stuck", "h", 3, old, 5, old - 1.0, 0.0, 2.0)]
    fresh, idle, stuck = lag_and_backlog(rows, now)
    assert (fresh["triggerer"], fresh["state"], fresh["stale"], fresh["lag_s"]) == (
        "fresh", "flushing", False, 0.5)
    assert (idle["state"], idle["stale"], idle["lag_s"]) == ("idle", False, 0.0)
    assert (stuck["state"], stuck["stale"], stuck["dirty_keys"]) == ("stalled", True, 5)
    summary = fleet_summary(rows, now)
    assert (summary["stale"], summary["idle"]) == (1, 1)
    # "stalled", as the UI, the CLI and the docs say it; "stale" stays for older readers
    assert [m["stalled"] for m in summary["triggerers"]] == [m["stale"] for m in
                                                           summary["triggerers"]]
    assert summary["stalled"] == summary["stale"] == 1


async def test_the_api_and_the_cli_show_the_fleet(
        open_store: StoreFactory, central: CentralStore, central_url: str) -> None:
    store: StateStore = await open_store(triggerer_id="fleet-live", flush_interval=60.0)
    await store.set("asset_watcher:f", "wm", 1)
    await store.flush()
    await record_stale(central, "fleet-stuck", ago=600.0)
    async with client_for(create_app(store.settings, local=store)) as client:
        answer = await client.get("/api/v1/fleet")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [m["triggerer"] for m in body["triggerers"]] == ["fleet-live", "fleet-stuck"]
    live, stuck = body["triggerers"]
    assert (live["stale"], stuck["stale"], body["stale"]) == (False, True, 1)
    assert (stuck["dirty_keys"], stuck["host"], stuck["pid"]) == (17, "elsewhere", 4242)
    assert stuck["lag_s"] == 2.0
    # the CLI, a process of its own
    text = ok(run("status", "--fleet", url=central_url)).stdout
    assert "2 triggerers" in text
    assert "1 stalled" in text
    [stuck_line] = [line for line in text.splitlines() if line.startswith("fleet-stuck")]
    assert "STALLED" in stuck_line
    assert " stalled " in stuck_line
    assert "elsewhere:4242" in stuck_line
    data = json.loads(ok(run("status", "--fleet", "--json", url=central_url)).stdout)
    assert [m["stale"] for m in data["fleet"]["triggerers"]] == [False, True]


async def test_the_fleet_route_needs_a_token_when_tokens_are_set(
        open_store: StoreFactory) -> None:
    store: StateStore = await open_store(triggerer_id="fleet-auth")
    tokens = Settings.resolve({"api_tokens": "fleet-token-0123456789:read:*"}).api_tokens
    async with client_for(create_app(store.settings, local=store, tokens=tokens)) as client:
        assert (await client.get("/api/v1/fleet")).status_code == 401
        answer = await client.get("/api/v1/fleet", headers={
            "Authorization": "Bearer fleet-token-0123456789"})
    assert answer.status_code == 200


def test_the_budget_stretches_and_shrinks_the_interval_never_below_the_base() -> None:
    budget = FlushBudget(100.0, base=1.0)
    assert budget.adjust(300.0) == 3.0  # over budget: stretched by the excess
    assert budget.adjust(1000.0) == 12.0  # at most 4x per reading
    assert budget.adjust(100.0) == 12.0  # on budget: kept
    assert budget.adjust(60.0) == pytest.approx(9.0)  # under 80 %: by rate/(0.8 budget)
    assert budget.adjust(0.0) == pytest.approx(4.5)  # at most halved per reading
    for _ in range(10):
        budget.adjust(0.0)
    assert budget.interval == 1.0  # never below flush_interval


async def test_triggerers_over_the_budget_stretch_their_flush_interval(
        open_store: StoreFactory, central_url: str) -> None:
    """Two triggerers, each setting 40 hot keys nonstop and flushing every 0.05 s (about
    1,600 rows/s together), under a budget of 40 rows/s: each reads the fleet table and
    stretches its interval; its stats and the fleet table show it."""
    stores = [await open_store(triggerer_id=f"budget-{i}", flush_interval=0.05,
                               central_budget_rows_per_s=40.0, durability="memory")
              for i in range(2)]
    deadline = time.monotonic() + 60.0
    n = 0
    while not all(s.stats().flush_interval_s > 0.2 for s in stores):
        assert time.monotonic() < deadline, [s.stats() for s in stores]
        for s in stores:
            for k in range(40):
                await s.set("asset_watcher:b", f"{s.triggerer_id}-{k}", n)
        n += 1
        await asyncio.sleep(0.005)
    for s in stores:
        stats = s.stats()
        assert stats.fleet_rows_per_s is not None
        assert stats.fleet_rows_per_s > 40.0  # what made it stretch
    central = await CentralStore.open(central_url)
    try:
        rows = {r.triggerer: r for r in await central.read_fleet()}
    finally:
        await central.close()
    assert set(rows) == {"budget-0", "budget-1"}
