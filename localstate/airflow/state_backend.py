"""`LocalStateBackend`: Airflow 3.3's ``[state_store] backend`` served by localstate.

Set it and nothing else changes in a DAG, a task or a trigger::

    [state_store]
    backend = localstate.airflow.state_backend.LocalStateBackend

It derives from Airflow's own `MetastoreBackend` (itself an ``airflow.state.BaseStoreBackend``,
the class the resolver accepts), so Airflow's Execution API hands it the writer of each asset
write (``set_asset_state_store``: a watcher, a task or the API) and every task scope stays
Airflow's: a task's ``context["task_state_store"]`` is read and written in the request's own
transaction on Airflow's ``task_state_store`` table, with Airflow's expiry, retention,
``clear(all_map_indices=...)`` and ``cleanup()``.

Asset scopes are localstate's owners ``asset_watcher:<asset name>``, the owners the trigger
mixin (`localstate.airflow.trigger`) uses, so a watcher keeps its state when it moves between
plain Airflow code and the mixin. Where an asset call lands depends on the process:

* **In the triggerer** (the supervisor, which serves the Execution API in its own process, is
  where this backend lives): a watcher's ``aset`` is a write to a localstate store in the
  supervisor, held in its local cache and flushed in fenced, batched transactions into
  localstate's central table, which the asset mirror copies into Airflow's
  ``asset_state_store`` in the same transaction (the central DB being Airflow's metadata DB).
  The first time this triggerer touches an asset it *claims* its owner: a triggerer the asset
  was moved away from (a zombie, frozen past the health threshold and then resumed) has its
  later writes refused by the central DB and raises `OwnerLost`, and, since every central
  transaction is bounded by ``central_transaction_timeout``, a frozen zombie cannot stall the
  takeover. A triggerer that lost an asset claims it again only when Airflow assigns the
  asset's watcher back to it (to a triggerer of its host, the only live one there). The store
  is closed (flushed) when the process exits normally.
* **Elsewhere** (the API server serving tasks): a task's asset write goes into the request's
  transaction twice: Airflow's ``asset_state_store`` row (with the task as its writer), and
  a new version of localstate's central record of the key (written by no cache file). A
  triggerer holding the key in its cache then meets a conflict at its next flush, settled by
  the owner's ``conflict_policy`` as between two localstate writers (``reject``: the task's
  value stays and the triggerer takes it; ``max``: the greater; ``last_writer_wins``: the
  triggerer's). Reads are Airflow's table, which the mirror keeps at the flushed values.

Switching on, a key neither table has diverged on is read as it stands; a key whose Airflow
row is newer than localstate's record (written while the backend was off) is taken from
Airflow's table the first time this process reads it. Switching off, Airflow's table holds
every flushed value (the mirror), so Airflow's own backend carries on from there.

Which process is which: ``LocalStateBackend(role=...)``; by default ``"triggerer"`` in the
process running ``airflow triggerer`` and ``"api"`` everywhere else.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

# the writer kind is defined only in Airflow's shared package (airflow.state re-exports the rest)
from airflow._shared.state import AssetScope, AssetStateStoreWriterKind, StoreScope, TaskScope
from airflow.configuration import conf
from airflow.jobs.job import Job
from airflow.models.asset import AssetModel, AssetWatcherModel
from airflow.models.asset_state_store import AssetStateStoreModel
from airflow.models.trigger import Trigger
from airflow.state.metastore import MetastoreBackend
from airflow.utils.net import get_hostname
from airflow.utils.session import create_session
from sqlalchemy import func, select, text

from localstate._core.config import Settings
from localstate._sync.central.dialects import batch_sql_for
from localstate._sync.central.schema import STATE_TABLE
from localstate.airflow._serving import central_url_of
from localstate.airflow.trigger import asset_owner
from localstate.blocking import BlockingStateStore
from localstate.errors import CentralUnavailable, ConfigError, OwnerLost

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

__all__ = ["BACKEND_SUFFIX", "LocalStateBackend", "Role"]

log = logging.getLogger("localstate.airflow.state_backend")

_T = TypeVar("_T")
Role = Literal["triggerer", "api"]

#: the backend's store is a writer of its own (its cache file beside the runner's)
BACKEND_SUFFIX: Final = "-state-backend"
#: who a task's write of an asset's state is recorded as, in localstate's table
TASK_WRITER: Final = "airflow-task"
#: Airflow's row counts as newer than localstate's record past this (the two clocks' text forms
#: round differently: microseconds on every dialect Airflow supports)
_NEWER_BY: Final = 0.001
_TOMBSTONE: Final = (
    f"UPDATE {STATE_TABLE} SET value = NULL, prev_version = version, version = version + 1, "
    "updated_at = :at, updated_by = :by, writer = NULL WHERE owner = :owner "
    "AND value IS NOT NULL")


def _default_role() -> Role:
    return "triggerer" if sys.argv[1:2] == ["triggerer"] else "api"


def _session_kw(session: Session | None) -> dict[str, Any]:
    # Airflow's @provide_session passes an explicit session=None through: leave it out
    return {} if session is None else {"session": session}


class LocalStateBackend(MetastoreBackend):
    """Airflow's state-store backend on localstate (see the module docstring).

    `store`: the store a triggerer's asset writes go to (default: opened on first use from the
    ``[localstate]`` settings, with ``-state-backend`` after the triggerer id, on Airflow's
    metadata DB unless ``central_url`` names another). `role`:
    ``"triggerer"`` or ``"api"`` (default: from the process's command).
    """

    def __init__(self, store: BlockingStateStore | None = None, *,
                 role: Role | None = None) -> None:
        super().__init__()
        self.role: Role = role or ("triggerer" if store is not None else _default_role())
        self._store = store
        self._lock = threading.Lock()
        #: asset ids to names (an asset's id never names another asset)
        self._names: dict[int, str] = {}
        #: owners claimed by this process's store
        self._claimed: set[str] = set()
        #: when this process first tried to claim an owner it has not claimed yet
        self._first_try: dict[str, float] = {}
        #: keys whose record this process has compared with Airflow's row
        self._compared: set[tuple[str, str]] = set()

    # -- the store ----------------------------------------------------------------------

    @property
    def store(self) -> BlockingStateStore:
        """The triggerer's store (opened on first use)."""
        with self._lock:
            if self._store is None or self._store.closed:
                settings = Settings.resolve()
                # the central DB is Airflow's metadata DB unless [localstate] names another
                # (the asset mirror, and a task's writes, need it to be)
                central = settings.central_url or central_url_of(
                    conf.get("database", "sql_alchemy_conn"))
                self._store = BlockingStateStore(
                    settings=settings, central_url=central,
                    triggerer_id=settings.resolved_triggerer_id + BACKEND_SUFFIX)
                atexit.register(self._store.close)  # a graceful stop flushes
            return self._store

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        front = self.store
        return asyncio.run_coroutine_threadsafe(coro, front.loop).result()

    def close(self) -> None:
        """Close (flush) the triggerer's store, if open."""
        with self._lock:
            store, self._store = self._store, None
        if store is not None:
            store.close()

    def _serve(self, owner: str) -> None:
        """Claim `owner` for this triggerer, once (see the module docstring)."""
        if owner in self._claimed:
            return
        front = self.store
        if not front.store.can_claim:
            raise ConfigError(
                "the localstate state backend fences triggerers with claims, which the "
                f"sink {front.settings.sink!r} cannot make: set [localstate] sink = sql "
                "(the central DB being Airflow's metadata DB) or sink = api")
        retry = owner in self._first_try
        since = self._first_try.setdefault(owner, time.time())
        try:
            # a retry claims only if nobody claimed the owner since the first try: a late
            # claim never takes an asset back from the triggerer it moved to (OwnerLost)
            self._run(front.store.claim(owner, hold=True,
                                        unless_claimed_since=since if retry else None))
        except CentralUnavailable:
            return  # the write stays in the cache, held; claimed at the next call
        self._claimed.add(owner)
        self._first_try.pop(owner, None)

    def _write(self, owner: str, scope: AssetScope, session: Session,
               write: Callable[[], _T]) -> _T:
        """`write` (of `owner`'s keys); if this triggerer lost the owner earlier and Airflow
        has since assigned the asset's watcher back to it, claim it again and write."""
        try:
            return write()
        except OwnerLost:
            if not self._assigned_here(scope, session):
                raise  # a zombie: the asset's watcher runs elsewhere now
            log.info("%s was assigned back to this triggerer: claiming it again", owner)
            self._claimed.discard(owner)
            self._first_try.pop(owner, None)
            self._serve(owner)
            return write()

    def _assigned_here(self, scope: AssetScope, session: Session) -> bool:
        """Whether Airflow runs `scope`'s watchers on this triggerer: each is assigned to a
        triggerer of this host, and this host has one live triggerer (two on one host cannot
        be told apart: then never, and the owner stays lost until this triggerer restarts)."""
        if scope.asset_id is None:
            return False
        hosts = set(session.scalars(
            select(Job.hostname).join(Trigger, Trigger.triggerer_id == Job.id)
            .join(AssetWatcherModel, AssetWatcherModel.trigger_id == Trigger.id)
            .where(AssetWatcherModel.asset_id == scope.asset_id)))
        me = get_hostname()
        if hosts != {me}:
            return False
        threshold = conf.getfloat("triggerer", "triggerer_health_check_threshold")
        since = datetime.now(timezone.utc) - timedelta(seconds=threshold)
        live = session.scalar(
            select(func.count()).select_from(Job).where(
                Job.job_type == "TriggererJob", Job.state == "running",
                Job.hostname == me, Job.latest_heartbeat > since))
        return live == 1

    # -- scopes -------------------------------------------------------------------------

    def _asset_name(self, scope: AssetScope, session: Session) -> str:
        if scope.name is not None:
            return scope.name
        if scope.asset_id is None:
            raise ValueError(f"{scope!r}: the server side needs the asset's id or name")
        name = self._names.get(scope.asset_id)
        if name is None:
            name = session.scalar(select(AssetModel.name).where(AssetModel.id == scope.asset_id))
            if name is None:
                raise ValueError(f"no asset has id {scope.asset_id}")
            self._names[scope.asset_id] = name
        return name

    def _airflow_row(self, scope: AssetScope, key: str, session: Session
                     ) -> tuple[str, datetime] | None:
        row = session.execute(
            select(AssetStateStoreModel.value, AssetStateStoreModel.updated_at).where(
                AssetStateStoreModel.asset_id == scope.asset_id,
                AssetStateStoreModel.key == key)).one_or_none()
        return None if row is None else (row[0], row[1])

    # -- get ----------------------------------------------------------------------------

    def get(self, scope: StoreScope, key: str, *, session: Session | None = None
            ) -> str | None:
        if isinstance(scope, TaskScope) or self.role != "triggerer":
            return super().get(scope, key, **_session_kw(session))
        if session is None:
            with create_session() as s:
                return self._get_asset(scope, key, s)
        return self._get_asset(scope, key, session)

    def _get_asset(self, scope: AssetScope, key: str, session: Session) -> str | None:
        owner = asset_owner(self._asset_name(scope, session))
        self._serve(owner)
        record = self.store.record(owner, key)
        if (owner, key) not in self._compared:
            airflow = self._airflow_row(scope, key, session) if scope.asset_id else None
            self._compared.add((owner, key))
            if airflow is not None and (
                    record is None or _posix(airflow[1]) > record.updated_at.timestamp()
                    + _NEWER_BY):
                # written while this backend was off: Airflow's value is the latest
                self.store.set(owner, key, json.loads(airflow[0]))
                return airflow[0]
        if record is None:
            return None
        return json.dumps(record.value)

    # -- set ----------------------------------------------------------------------------

    def set(self, scope: StoreScope, key: str, value: str, *,
            expires_at: datetime | None = None, session: Session | None = None) -> None:
        if isinstance(scope, TaskScope):
            super().set(scope, key, value, expires_at=expires_at, **_session_kw(session))
            return
        self.set_asset_state_store(
            scope, key, value,
            kind=(AssetStateStoreWriterKind.WATCHER if self.role == "triggerer"
                  else AssetStateStoreWriterKind.API), **_session_kw(session))

    def set_asset_state_store(
        self, scope: AssetScope, key: str, value: str, *, kind: AssetStateStoreWriterKind,
        dag_id: str | None = None, run_id: str | None = None, task_id: str | None = None,
        map_index: int | None = None, session: Session | None = None,
    ) -> None:
        if session is None:
            with create_session() as s:
                self.set_asset_state_store(scope, key, value, kind=kind, dag_id=dag_id,
                                           run_id=run_id, task_id=task_id,
                                           map_index=map_index, session=s)
            return
        if kind is AssetStateStoreWriterKind.WATCHER and self.role == "triggerer":
            owner = asset_owner(self._asset_name(scope, session))
            self._serve(owner)
            self._compared.add((owner, key))  # this write is the latest
            data = json.loads(value)
            self._write(owner, scope, session, lambda: self.store.set(owner, key, data))
            return
        # a task's (or the API's) write: both tables, in the request's transaction
        super().set_asset_state_store(scope, key, value, kind=kind, dag_id=dag_id,
                                      run_id=run_id, task_id=task_id, map_index=map_index,
                                      session=session)
        by = (TASK_WRITER if dag_id is None
              else f"{TASK_WRITER}:{dag_id}/{run_id}/{task_id}/{map_index}")
        self._write_central(session, asset_owner(self._asset_name(scope, session)), key,
                            value, by)

    def _write_central(self, session: Session, owner: str, key: str, value: str | None,
                       by: str) -> None:
        """A new version of localstate's record of `key`, in `session`'s transaction (a
        deletion: a tombstone, when there is a value to delete)."""
        sql = batch_sql_for(session.get_bind().dialect.name)
        at = sql.timestamp(time.time())
        if value is None:
            quoted = "`key`" if _mysql(session) else '"key"'
            session.execute(text(f"{_TOMBSTONE} AND {quoted} = :key"),
                            {"owner": owner, "key": key, "at": at, "by": by[:250]})
            return
        session.execute(sql.direct_upsert, {"owner": owner, "key": key, "value": value,
                                            "at": at, "by": by[:250], "writer": None})

    # -- delete and clear ---------------------------------------------------------------

    def delete(self, scope: StoreScope, key: str, *, session: Session | None = None) -> None:
        if isinstance(scope, TaskScope):
            super().delete(scope, key, **_session_kw(session))
            return
        if session is None:
            with create_session() as s:
                self.delete(scope, key, session=s)
            return
        owner = asset_owner(self._asset_name(scope, session))
        super().delete(scope, key, session=session)
        if self.role == "triggerer":
            self._serve(owner)
            self._compared.add((owner, key))
            self._write(owner, scope, session, lambda: self.store.delete(owner, key))
        else:
            self._write_central(session, owner, key, None, TASK_WRITER)

    def clear(self, scope: StoreScope, *, all_map_indices: bool = False,
              session: Session | None = None) -> None:
        if isinstance(scope, TaskScope):
            super().clear(scope, all_map_indices=all_map_indices, **_session_kw(session))
            return
        if session is None:
            with create_session() as s:
                self.clear(scope, session=s)
            return
        owner = asset_owner(self._asset_name(scope, session))
        keys = set(session.scalars(select(AssetStateStoreModel.key).where(
            AssetStateStoreModel.asset_id == scope.asset_id)))
        super().clear(scope, session=session)
        if self.role == "triggerer":
            self._serve(owner)
            self.store.load(owner)
            keys |= {record.key for record in self.store.items(owner)}
            for key in sorted(keys):
                self._compared.add((owner, key))
                self._write(owner, scope, session,
                            functools.partial(self.store.delete, owner, key))
        else:
            session.execute(text(_TOMBSTONE), {"owner": owner, "at": batch_sql_for(
                session.get_bind().dialect.name).timestamp(time.time()), "by": TASK_WRITER})

    # -- async: task scopes are Airflow's; asset scopes run the sync path in a thread ----

    async def aget(self, scope: StoreScope, key: str, *,
                   session: AsyncSession | None = None) -> str | None:
        if isinstance(scope, TaskScope) or self.role != "triggerer":
            return await super().aget(scope, key, session=session)
        if session is not None:
            return await session.run_sync(lambda s: self.get(scope, key, session=s))
        return await asyncio.to_thread(self.get, scope, key)

    async def aset(self, scope: StoreScope, key: str, value: str, *,
                   expires_at: datetime | None = None,
                   session: AsyncSession | None = None) -> None:
        if isinstance(scope, TaskScope):
            await super().aset(scope, key, value, expires_at=expires_at, session=session)
            return
        if session is not None:
            await session.run_sync(lambda s: self.set(scope, key, value, session=s))
            return
        await asyncio.to_thread(self.set, scope, key, value)

    async def adelete(self, scope: StoreScope, key: str, *,
                      session: AsyncSession | None = None) -> None:
        if isinstance(scope, TaskScope):
            await super().adelete(scope, key, session=session)
            return
        if session is not None:
            await session.run_sync(lambda s: self.delete(scope, key, session=s))
            return
        await asyncio.to_thread(self.delete, scope, key)

    async def aclear(self, scope: StoreScope, *, all_map_indices: bool = False,
                     session: AsyncSession | None = None) -> None:
        if isinstance(scope, TaskScope):
            await super().aclear(scope, all_map_indices=all_map_indices, session=session)
            return
        if session is not None:
            await session.run_sync(lambda s: self.clear(scope, session=s))
            return
        await asyncio.to_thread(self.clear, scope)


def _mysql(session: Session) -> bool:
    return session.get_bind().dialect.name in ("mysql", "mariadb")


def _posix(at: datetime) -> float:
    return (at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)).timestamp()
