"""Emitted events become Airflow asset events (`localstate._sync.central.asset_events`), through a
real ``airflow api-server`` with localstate's plugin (``sink = api``) on a migrated Airflow 3.3
metadata DB (PostgreSQL): the watermark, the de-duplication row and the asset events commit in
one transaction, consumer DAGs are queued as for a yielded ``TriggerEvent``, a replay adds
nothing and a zombie's batch adds nothing. Also ``sink = sql`` on Airflow's metadata DB.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from airflow_api_server import MACHINE_TOKEN, ApiServer, api_server, migrate, new_airflow
from airflow_harness import Deployment

from localstate import StateStore
from localstate._core.conflicts import PolicyMap
from localstate._core.rows import DirtyRow, EventRow
from localstate._sync.sinks.api_sink import ApiSink
from localstate._testing.postgres_server import PostgresServer
from localstate.airflow._serving import central_url_of

CONSUMER = "consume_orders"


@pytest.fixture(scope="module")
def migrated(pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
             ) -> Deployment:
    d = new_airflow(pg_server, tmp_path_factory.mktemp("airflow-events"))
    migrate(d)
    return d


@pytest.fixture(scope="module")
def server(migrated: Deployment) -> Iterator[ApiServer]:
    with api_server(migrated) as s:
        yield s


@pytest_asyncio.fixture
async def db(migrated: Deployment) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(migrated.airflow_dsn)
    try:
        yield conn
    finally:
        await conn.close()


async def watched_asset(db: asyncpg.Connection, name: str) -> int:
    """An active asset and a DAG scheduled on it (unpaused), as the dag processor makes."""
    asset_id = await db.fetchval(
        "INSERT INTO asset (name, uri, \"group\", extra, created_at, updated_at) "
        "VALUES ($1, $2, 'asset', '{}', now(), now()) RETURNING id", name, f"test://{name}")
    await db.execute("INSERT INTO asset_active (name, uri) VALUES ($1, $2)", name,
                     f"test://{name}")
    await db.execute("INSERT INTO dag_bundle (name, active) VALUES ('dags-folder', true) "
                     "ON CONFLICT DO NOTHING")
    dag_id = f"{CONSUMER}_{name}"
    await db.execute(
        "INSERT INTO dag (dag_id, is_paused, is_stale, bundle_name, max_active_tasks, "
        "max_consecutive_failed_dag_runs, has_task_concurrency_limits, "
        "exceeds_max_non_backfill, timetable_type, timetable_partitioned, "
        "timetable_periodic, fail_fast, partition_mapper_info) VALUES ($1, false, false, "
        "'dags-folder', 16, 0, false, false, 'AssetTriggeredTimetable', false, false, false, "
        "'[]')", dag_id)
    await db.execute("INSERT INTO dag_schedule_asset_reference (asset_id, dag_id, created_at, "
                     "updated_at) VALUES ($1, $2, now(), now())", asset_id, dag_id)
    return int(asset_id)


async def asset_events(db: asyncpg.Connection, asset_id: int) -> list[dict[str, Any]]:
    rows = await db.fetch("SELECT extra FROM asset_event WHERE asset_id = $1 ORDER BY id",
                          asset_id)
    return [json.loads(r["extra"]) if isinstance(r["extra"], str) else r["extra"]
            for r in rows]


async def queued(db: asyncpg.Connection, asset_id: int) -> list[str]:
    return [r["target_dag_id"] for r in await db.fetch(
        "SELECT target_dag_id FROM asset_dag_run_queue WHERE asset_id = $1", asset_id)]


def api_store(server: ApiServer, tmp_path: Path, triggerer: str) -> Any:
    return StateStore.open(
        sink="api", api_url=f"{server.url}/localstate", api_token=MACHINE_TOKEN,
        cache_path=tmp_path / f"{triggerer}.db", triggerer_id=triggerer, flush_interval=60)


async def test_emitted_events_become_asset_events_once_with_the_watermark(
    server: ApiServer, db: asyncpg.Connection, tmp_path: Path,
) -> None:
    asset_id = await watched_asset(db, "orders")
    owner = "asset_watcher:orders"
    store = await api_store(server, tmp_path, "triggerer-a")
    try:
        assert await store.claim(owner) == 1
        for i in range(1, 6):
            await store.emit(owner, {"order": i}, watermark=i)
        assert await asset_events(db, asset_id) == []  # not before the flush
        report = await store.flush()
        assert report.events == 5
    finally:
        await store.close()
    # as Trigger.submit_event records a yielded event, in emit order
    assert await asset_events(db, asset_id) == [
        {"from_trigger": True, "payload": {"order": i}} for i in range(1, 6)]
    assert await queued(db, asset_id) == [f"{CONSUMER}_orders"]
    dedup = await db.fetch("SELECT key, asset_events FROM localstate_event WHERE owner = $1 "
                           "ORDER BY seq", owner)
    assert [(r["key"], r["asset_events"]) for r in dedup] == [(str(i), 1) for i in range(1, 6)]
    value = await db.fetchval("SELECT value FROM localstate_state WHERE owner = $1 "
                              "AND key = 'watermark'", owner)
    assert json.loads(value) == 5


async def test_a_replayed_batch_and_a_zombies_batch_add_no_asset_event(
    server: ApiServer, db: asyncpg.Connection,
) -> None:
    asset_id = await watched_asset(db, "payments")
    owner = "asset_watcher:payments"
    sink = ApiSink(f"{server.url}/localstate", MACHINE_TOKEN)
    policies = PolicyMap("reject")
    try:
        assert await sink.claim(owner, claimant="a", writer="file-a") == 1
        rows = [DirtyRow(owner, "watermark", "2", 1, 0, 1.0e9, "a", 1)]
        events = [EventRow(1, owner, "1", '"p1"', 1.0e9, 1),
                  EventRow(2, owner, "2", '"p2"', 1.0e9, 1)]
        _out, first = await sink.write_with_events(rows, events, policies, writer="file-a")
        # the answer was lost: the same batch again
        _out, again = await sink.write_with_events(rows, events, policies, writer="file-a")
        assert first == ["committed", "committed"]
        assert again == ["duplicate", "duplicate"]
        assert len(await asset_events(db, asset_id)) == 2
        # another triggerer claims the owner; the old one (a zombie) flushes the next items
        assert await sink.claim(owner, claimant="b", writer="file-b") == 2
        zombie_rows = [DirtyRow(owner, "watermark", "3", 2, 1, 1.0e9 + 1, "a", 1)]
        outcomes, statuses = await sink.write_with_events(
            zombie_rows, [EventRow(3, owner, "3", '"p3"', 1.0e9, 1)], policies,
            writer="file-a")
        assert statuses == ["refused"]
        assert outcomes[0].lost_to == 2
    finally:
        await sink.close()
    assert [e["payload"] for e in await asset_events(db, asset_id)] == ["p1", "p2"]
    value = await db.fetchval("SELECT value FROM localstate_state WHERE owner = $1 "
                              "AND key = 'watermark'", owner)
    assert json.loads(value) == 2


async def test_sink_sql_on_airflows_metadata_db_commits_asset_events_too(
    migrated: Deployment, server: ApiServer, db: asyncpg.Connection, tmp_path: Path,
) -> None:
    """A process that may write Airflow's tables (central_url is Airflow's metadata DB, Airflow
    importable) gets the same transaction without the API server."""
    asset_id = await watched_asset(db, "refunds")
    owner = "asset_watcher:refunds"
    store = await StateStore.open(
        central_url=central_url_of(migrated.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]),
        cache_path=tmp_path / "sql.db", triggerer_id="sql-writer", flush_interval=60)
    try:
        await store.emit(owner, {"refund": 1}, watermark="2026-12-05T10:00:00")
        await store.emit(owner, {"refund": 1}, watermark="2026-12-05T10:00:00")  # a repeat
        await store.flush()
        figures = store.event_figures()[owner]
        assert (figures.committed, figures.duplicates) == (1, 1)
    finally:
        await store.close()
    assert await asset_events(db, asset_id) == [{"from_trigger": True,
                                                  "payload": {"refund": 1}}]
    assert await queued(db, asset_id) == [f"{CONSUMER}_refunds"]


async def test_a_trigger_watching_two_assets_emits_to_each_once(
    migrated: Deployment, server: ApiServer, db: asyncpg.Connection, tmp_path: Path,
) -> None:
    """`StateEnabledTrigger.emit` with two watched assets: one asset event per item on each,
    then the trigger's own watermark; re-running it from that watermark adds nothing."""
    import greenback
    from airflow.sdk import Asset
    from airflow.sdk.execution_time.context import AssetStateStoreAccessors
    from driven_triggers import EmittingTrigger, drive

    from localstate._store import StateVariable

    ids = [await watched_asset(db, name) for name in ("eu-orders", "us-orders")]
    store = await StateStore.open(
        central_url=central_url_of(migrated.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]),
        cache_path=tmp_path / "two.db", triggerer_id="two-assets", flush_interval=60)
    StateVariable.configure(store)
    try:
        await greenback.ensure_portal()
        for last in (3, 3, 4):  # the second run starts at its watermark: nothing to emit
            trigger = EmittingTrigger(source="orders-two", last=last)
            trigger.asset_state_store = AssetStateStoreAccessors(
                inlets=[Asset(name="eu-orders"), Asset(name="us-orders")])
            await drive(trigger, 1)
            await store.flush()
        assert await store.get(trigger.state_owner, "watermark") == 4
    finally:
        StateVariable.configure(None)
        await store.close()
    for asset_id in ids:
        assert [e["payload"] for e in await asset_events(db, asset_id)] == [
            {"item": i} for i in range(1, 5)]


class _Listener:
    """An Airflow listener recording the asset hooks it is called with."""

    def __init__(self) -> None:
        self.changed: list[str] = []
        self.emitted: list[tuple[str, Any]] = []

    def plugged(self) -> Any:
        from airflow.listeners import hookimpl

        listener = self

        class Hooks:
            @hookimpl
            def on_asset_changed(self, asset: Any) -> None:
                listener.changed.append(asset.name)

            @hookimpl
            def on_asset_event_emitted(self, asset_event: Any) -> None:
                listener.emitted.append((asset_event.asset.name, asset_event.extra["payload"]))

        return Hooks()


async def test_many_events_of_one_flush_are_the_rows_and_calls_airflows_path_makes(
    migrated: Deployment, db: asyncpg.Connection, tmp_path: Path,
) -> None:
    """A flush of many events of one asset writes the rest of them in one INSERT after the
    first went through `AssetManager.register_asset_change`: the rows (columns Airflow sets,
    order, consumers queued) and the listener calls are those Airflow's path makes for each
    event, checked against `register_asset_change` called once per event on another asset."""
    from airflow.assets.manager import AssetManager
    from airflow.listeners.listener import get_listener_manager
    from airflow.serialization.definitions.assets import SerializedAssetUniqueKey
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    ours, theirs = (await watched_asset(db, "batched"), await watched_asset(db, "one-by-one"))
    listener = _Listener()
    hooks = listener.plugged()
    manager = get_listener_manager()
    manager.add_listener(hooks)  # type: ignore[no-untyped-call]
    n = 40
    store = await StateStore.open(
        central_url=central_url_of(migrated.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]),
        cache_path=tmp_path / "batch.db", triggerer_id="batcher", flush_interval=60)
    try:
        for i in range(1, n + 1):
            await store.emit("asset_watcher:batched", {"i": i}, watermark=i)
        assert (await store.flush()).events == n
    finally:
        await store.close()
    engine = create_engine(migrated.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        with Session(engine) as session:
            for i in range(1, n + 1):
                AssetManager.register_asset_change(
                    asset=SerializedAssetUniqueKey(name="one-by-one", uri="test://one-by-one"),
                    extra={"from_trigger": True, "payload": {"i": i}}, session=session)
            session.commit()
    finally:
        engine.dispose()
        manager.pm.unregister(hooks)

    async def rows(asset_id: int) -> list[tuple[Any, ...]]:
        got = await db.fetch(
            "SELECT extra, source_task_id, source_dag_id, source_run_id, source_map_index, "
            "partition_key, timestamp FROM asset_event WHERE asset_id = $1 ORDER BY id",
            asset_id)
        out = [(json.loads(r["extra"]) if isinstance(r["extra"], str) else r["extra"],
                r["source_task_id"], r["source_dag_id"], r["source_run_id"],
                r["source_map_index"], r["partition_key"]) for r in got]
        stamps = [r["timestamp"] for r in got]
        assert stamps == sorted(stamps)
        return out

    assert await rows(ours) == await rows(theirs)
    assert len(await rows(ours)) == n
    assert await queued(db, ours) == [f"{CONSUMER}_batched"]
    assert await queued(db, theirs) == [f"{CONSUMER}_one-by-one"]
    for name in ("batched", "one-by-one"):
        assert listener.changed.count(name) == n
        assert [p for a, p in listener.emitted if a == name] == [{"i": i}
                                                                 for i in range(1, n + 1)]
