"""`LocalStateBackend`, Airflow's ``[state_store] backend``, on each central backend.

Airflow's own tables (created from its models) and localstate's live in one test database, as
in a deployment where the central DB is Airflow's metadata DB; the calls are the ones Airflow's
Execution API makes (`set_asset_state_store` with the writer's kind, `get`, `delete`, `clear`,
with the request's session):

* a watcher's write (the triggerer's backend) stays in the store's cache until its flush,
  which writes localstate's table and Airflow's ``asset_state_store`` (the mirror) together;
* a triggerer the asset moved away from (a zombie) has its late write refused: the new
  owner's value stays in both tables, and the zombie's next write raises `OwnerLost`;
* a task's write (the API server's backend) lands in both tables in the request's
  transaction, and a triggerer holding the key in its cache meets it as a conflict at its
  flush, settled by the owner's policy (``reject``: the task's value stays, the triggerer
  takes it), never lost silently;
* switching on: a value Airflow's table holds (written by Airflow's default backend) is read;
  switching off (a graceful stop flushes): Airflow's table holds the latest values; on again:
  a newer value there wins over an older localstate record;
* task scopes are Airflow's: the request's session, ``expires_at``, ``all_map_indices``;
* the async methods take an ``AsyncSession`` and run in its transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from airflow._shared.state import AssetScope, AssetStateStoreWriterKind, TaskScope
from airflow.models import import_all_models
from airflow.models.asset import AssetActive, AssetModel
from airflow.models.base import Base
from airflow.models.dagrun import DagRun
from airflow.utils.net import get_hostname
from alembic_revisions import sync_engine
from sqlalchemy import Connection, Engine, Table, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from localstate._sync.central.engine import async_url
from localstate.airflow.state_backend import TASK_WRITER, LocalStateBackend
from localstate.blocking import BlockingStateStore
from localstate.errors import OwnerLost

WATCHER = AssetStateStoreWriterKind.WATCHER
TASK = AssetStateStoreWriterKind.TASK
OWNER = "asset_watcher:orders"


#: Airflow's tables the backend reads and writes (and, below, those their keys refer to)
AIRFLOW_TABLES = ("asset", "asset_active", "asset_state_store", "task_state_store", "dag_run",
                  "asset_watcher", "trigger", "job")


def _tables(names: tuple[str, ...]) -> list[Table]:
    """`names`' tables and those their foreign keys refer to, from Airflow's models."""
    tables = Base.metadata.tables
    wanted, todo = set(names), list(names)
    while todo:
        for fk in tables[todo.pop()].foreign_keys:
            if fk.column.table.name not in wanted:
                wanted.add(fk.column.table.name)
                todo.append(fk.column.table.name)
    return [tables[name] for name in sorted(wanted)]


@pytest.fixture
def airflow_db(central_url: str) -> Iterator[Engine]:
    """The central DB with Airflow's tables, one active asset ``orders`` and one DAG run."""
    import_all_models()  # type: ignore[no-untyped-call]  # Airflow: untyped
    engine = sync_engine(central_url)
    Base.metadata.create_all(engine, tables=_tables(AIRFLOW_TABLES))
    with Session(engine) as s, s.begin():
        asset = AssetModel(name="orders", uri="s3://bucket/orders")
        s.add(asset)
        s.flush()
        s.add(AssetActive.for_asset(asset))
        s.add(DagRun(dag_id="etl", run_id="r1", run_type="manual"))
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def stores(central_url: str, tmp_path: Path, airflow_db: Engine) -> Iterator[Any]:
    opened: list[BlockingStateStore] = []

    def open_store(name: str) -> BlockingStateStore:
        store = BlockingStateStore(central_url=central_url, cache_path=tmp_path / f"{name}.db",
                                   triggerer_id=name, flush_interval=60.0, sink="sql")
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def _asset_id(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM asset WHERE name = 'orders'")).scalar_one())


def _airflow_row(engine: Engine, key: str) -> tuple[Any, str | None] | None:
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT s.value, s.last_updated_by_kind FROM asset_state_store s WHERE s.key = :k"),
            {"k": key}).one_or_none()
    return None if row is None else (json.loads(row[0]), row[1])


def _central(engine: Engine, key: str) -> tuple[Any, int, str | None] | None:
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT value, version, updated_by FROM localstate_state WHERE owner = :o "
            "AND " + ('`key`' if engine.dialect.name == "mysql" else '"key"') + " = :k"),
            {"o": OWNER, "k": key}).one_or_none()
    return None if row is None else (
        None if row[0] is None else json.loads(row[0]), int(row[1]), row[2])


def _watcher_set(backend: LocalStateBackend, engine: Engine, key: str, value: Any) -> None:
    """What the triggerer's in-process Execution API does for a watcher's ``aset``."""
    with Session(engine) as s, s.begin():
        backend.set_asset_state_store(AssetScope(asset_id=_asset_id(engine)), key,
                                      json.dumps(value), kind=WATCHER, session=s)


def _get(backend: LocalStateBackend, engine: Engine, key: str) -> Any:
    with Session(engine) as s, s.begin():
        value = backend.get(AssetScope(asset_id=_asset_id(engine)), key, session=s)
    return None if value is None else json.loads(value)


def test_a_watchers_write_is_cached_then_flushed_into_both_tables(
        airflow_db: Engine, stores: Any) -> None:
    store = stores("t1")
    backend = LocalStateBackend(store)
    _watcher_set(backend, airflow_db, "watermark", 5)
    assert _get(backend, airflow_db, "watermark") == 5
    assert _airflow_row(airflow_db, "watermark") is None  # not flushed yet
    store.flush()
    assert _airflow_row(airflow_db, "watermark") == (5, "watcher")
    assert _central(airflow_db, "watermark") == (5, 1, "t1" + "")
    assert store.store.claim_epoch(OWNER) == 1  # the first touch claimed the asset's owner


def test_a_zombies_late_write_is_refused(airflow_db: Engine, stores: Any) -> None:
    zombie_store, new_store = stores("zombie"), stores("new")
    zombie, new = LocalStateBackend(zombie_store), LocalStateBackend(new_store)
    _watcher_set(zombie, airflow_db, "watermark", 742)
    zombie_store.flush()
    # the asset moved: the new triggerer's first call claims the owner (epoch 2)
    assert _get(new, airflow_db, "watermark") == 742
    _watcher_set(new, airflow_db, "watermark", 760)
    new_store.flush()
    # the zombie wakes and writes what it had in flight: refused at its flush
    _watcher_set(zombie, airflow_db, "watermark", 727)
    zombie_store.flush()
    assert zombie_store.store.claims_refused == 1
    with pytest.raises(OwnerLost):
        _watcher_set(zombie, airflow_db, "watermark", 728)
    assert _airflow_row(airflow_db, "watermark") == (760, "watcher")
    assert _central(airflow_db, "watermark") == (760, 2, "new")


def _insert(conn: Connection, table: Table, **values: Any) -> int:
    key = conn.execute(table.insert().values(**values)).inserted_primary_key
    assert key is not None
    return int(key[0])


def _assign(engine: Engine, *hosts: str) -> None:
    """Airflow's assignment: the watcher of ``orders`` runs on a live triggerer of the first
    of `hosts`; each of the others has a live triggerer too."""
    tables = Base.metadata.tables
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        for table in ("asset_watcher", "trigger", "job"):
            conn.execute(tables[table].delete())
        jobs = [_insert(conn, tables["job"], job_type="TriggererJob", state="running",
                        hostname=host, start_date=now, latest_heartbeat=now) for host in hosts]
        trigger = _insert(conn, tables["trigger"], classpath="x.CountingWatcher",
                          kwargs="{}", created_date=now, triggerer_id=jobs[0])
        conn.execute(tables["asset_watcher"].insert().values(
            name="w", asset_id=_asset_id(engine), trigger_id=trigger))


def test_a_triggerer_claims_an_asset_again_only_when_airflow_assigns_it_back(
        airflow_db: Engine, stores: Any) -> None:
    me: str = get_hostname()  # type: ignore[no-untyped-call]  # Airflow's: untyped
    here_store, there_store = stores("here"), stores("there")
    here, there = LocalStateBackend(here_store), LocalStateBackend(there_store)
    _watcher_set(here, airflow_db, "watermark", 1)
    here_store.flush()
    _watcher_set(there, airflow_db, "watermark", 2)  # the asset moved: claimed there
    there_store.flush()
    _watcher_set(here, airflow_db, "watermark", 3)  # a zombie's late write: refused
    here_store.flush()
    # Airflow runs the watcher on another host: here stays a zombie
    _assign(airflow_db, "another-host")
    with pytest.raises(OwnerLost):
        _watcher_set(here, airflow_db, "watermark", 4)
    # on this host, but two live triggerers here: which one cannot be told, so still refused
    _assign(airflow_db, me, me)
    with pytest.raises(OwnerLost):
        _watcher_set(here, airflow_db, "watermark", 4)
    assert _central(airflow_db, "watermark") == (2, 2, "there")
    # assigned back to this host's one triggerer: claimed again (epoch 3), and written
    _assign(airflow_db, me)
    _watcher_set(here, airflow_db, "watermark", 5)
    here_store.flush()
    assert here_store.store.claim_epoch(OWNER) == 3
    assert _central(airflow_db, "watermark") == (5, 3, "here")
    assert _airflow_row(airflow_db, "watermark") == (5, "watcher")
    # and the triggerer it moved away from is the zombie now
    _watcher_set(there, airflow_db, "watermark", 6)
    there_store.flush()
    assert there_store.store.claims_refused == 1
    assert _central(airflow_db, "watermark") == (5, 3, "here")


def test_a_tasks_write_meets_a_cached_watcher_write_as_a_conflict(
        airflow_db: Engine, stores: Any) -> None:
    store = stores("t1")
    triggerer, api = LocalStateBackend(store), LocalStateBackend(role="api")
    _watcher_set(triggerer, airflow_db, "cursor", 10)
    store.flush()
    _watcher_set(triggerer, airflow_db, "cursor", 11)  # in the triggerer's cache only
    with Session(airflow_db) as s, s.begin():  # the task's request, one transaction
        api.set_asset_state_store(AssetScope(asset_id=_asset_id(airflow_db)), "cursor",
                                  json.dumps(50), kind=TASK, dag_id="etl", run_id="r1",
                                  task_id="reset", map_index=-1, session=s)
    assert _airflow_row(airflow_db, "cursor") == (50, "task")
    assert _central(airflow_db, "cursor") == (50, 2, f"{TASK_WRITER}:etl/r1/reset/-1")
    assert _get(api, airflow_db, "cursor") == 50
    report = store.flush()
    assert report.conflicts == 1  # reported, not lost silently
    # reject (the default policy): the task's value stays, and the triggerer took it
    assert _central(airflow_db, "cursor") == (50, 2, f"{TASK_WRITER}:etl/r1/reset/-1")
    assert _airflow_row(airflow_db, "cursor") == (50, "watcher")  # the mirror's stamp
    assert _get(triggerer, airflow_db, "cursor") == 50


def test_a_tasks_delete_and_clear_reach_both_tables(airflow_db: Engine, stores: Any) -> None:
    store = stores("t1")
    triggerer, api = LocalStateBackend(store), LocalStateBackend(role="api")
    _watcher_set(triggerer, airflow_db, "a", 1)
    _watcher_set(triggerer, airflow_db, "b", 2)
    store.flush()
    scope = AssetScope(asset_id=_asset_id(airflow_db))
    with Session(airflow_db) as s, s.begin():
        api.delete(scope, "a", session=s)
    assert _airflow_row(airflow_db, "a") is None
    assert _central(airflow_db, "a") == (None, 2, TASK_WRITER)
    with Session(airflow_db) as s, s.begin():
        api.clear(scope, session=s)
    assert _airflow_row(airflow_db, "b") is None
    assert _central(airflow_db, "b") == (None, 2, TASK_WRITER)
    # the triggerer's cache still serves b = 2 (clean); its next write of b meets the
    # clear as a conflict, and under reject the clear stays
    assert _get(triggerer, airflow_db, "b") == 2
    _watcher_set(triggerer, airflow_db, "b", 3)
    assert store.flush().conflicts == 1
    assert _get(triggerer, airflow_db, "b") is None
    assert _airflow_row(airflow_db, "b") is None


def test_the_triggerers_clear_deletes_every_key_there_and_here(
        airflow_db: Engine, stores: Any) -> None:
    store = stores("t1")
    backend = LocalStateBackend(store)
    _watcher_set(backend, airflow_db, "a", 1)
    store.flush()
    _watcher_set(backend, airflow_db, "b", 2)  # cached only
    with Session(airflow_db) as s, s.begin():
        backend.clear(AssetScope(asset_id=_asset_id(airflow_db)), session=s)
    assert _get(backend, airflow_db, "a") is None
    assert _get(backend, airflow_db, "b") is None
    store.flush()
    assert _airflow_row(airflow_db, "a") is None
    assert _airflow_row(airflow_db, "b") is None
    assert _central(airflow_db, "a") == (None, 2, "t1")


def test_switching_on_and_off_loses_nothing(airflow_db: Engine, stores: Any) -> None:
    from airflow.state.metastore import MetastoreBackend

    airflow = MetastoreBackend()  # Airflow's own backend: the setting switched off
    scope = AssetScope(asset_id=_asset_id(airflow_db))
    with Session(airflow_db) as s, s.begin():
        airflow.set_asset_state_store(scope, "old", json.dumps(3), kind=WATCHER, session=s)
    # switched on: the existing row is found
    first = stores("t1")
    backend = LocalStateBackend(first)
    assert _get(backend, airflow_db, "old") == 3
    _watcher_set(backend, airflow_db, "later", 7)
    first.close()  # the triggerer stops (gracefully): its store flushes on the way out
    # switched off: Airflow's table holds the latest values, and Airflow's backend writes on
    with Session(airflow_db) as s, s.begin():
        assert airflow.get(scope, "later", session=s) == "7"
        airflow.set_asset_state_store(scope, "later", json.dumps(8), kind=WATCHER, session=s)
    # switched on again: Airflow's newer value wins over localstate's older record
    again_store = stores("t2")
    again = LocalStateBackend(again_store)
    assert _get(again, airflow_db, "later") == 8
    assert _get(again, airflow_db, "old") == 3
    _watcher_set(again, airflow_db, "later", 9)
    again_store.flush()
    assert _central(airflow_db, "later") is not None
    assert _airflow_row(airflow_db, "later") == (9, "watcher")


def test_task_scopes_are_airflows_in_the_requests_session(airflow_db: Engine) -> None:
    backend = LocalStateBackend(role="api")
    later = datetime.now(timezone.utc) + timedelta(days=1)
    with Session(airflow_db) as s, s.begin():
        for index in (0, 1):
            scope = TaskScope("etl", "r1", "load", index)
            backend.set(scope, "offset", json.dumps(index * 10), expires_at=later, session=s)
        assert backend.get(TaskScope("etl", "r1", "load", 1), "offset", session=s) == "10"
    with Session(airflow_db) as s, s.begin():
        backend.clear(TaskScope("etl", "r1", "load", 0), session=s)
        assert backend.get(TaskScope("etl", "r1", "load", 1), "offset", session=s) == "10"
        backend.clear(TaskScope("etl", "r1", "load", 0), all_map_indices=True, session=s)
        assert backend.get(TaskScope("etl", "r1", "load", 1), "offset", session=s) is None
    with airflow_db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM task_state_store")).scalar_one() == 0


async def test_the_async_methods_run_in_the_given_session(
        central_url: str, airflow_db: Engine, stores: Any) -> None:
    store = stores("t1")
    backend = LocalStateBackend(store)
    # a plain async engine, as Airflow's (localstate's own begins SQLite's transactions
    # IMMEDIATE: its write lock would hold the store's claim back)
    engine = create_async_engine(async_url(central_url))
    scope = AssetScope(asset_id=_asset_id(airflow_db))
    try:
        async with AsyncSession(engine) as s, s.begin():
            await backend.aset(scope, "watermark", json.dumps(4), session=s)
            assert await backend.aget(scope, "watermark", session=s) == "4"
            await backend.adelete(scope, "watermark", session=s)
            assert await backend.aget(scope, "watermark", session=s) is None
        async with AsyncSession(engine) as s, s.begin():
            task = TaskScope("etl", "r1", "load")
            await backend.aset(task, "k", json.dumps("v"), session=s)
            assert await backend.aget(task, "k", session=s) == '"v"'
            await backend.aclear(task, session=s)
            assert await backend.aget(task, "k", session=s) is None
    finally:
        await engine.dispose()
