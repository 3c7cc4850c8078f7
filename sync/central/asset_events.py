"""`AssetEvents`: an asset watcher's emitted events become Airflow asset events, in the flush's
own transaction.

When the central DB is Airflow's metadata DB, each new event
(`localstate._sync.central.fenced_write`) whose owner names an asset (``asset_watcher:<asset
name>``) is registered through Airflow's own ``AssetManager.register_asset_change(asset=...,
extra={"from_trigger": True, "payload": ...}, session=...)``, exactly as ``Trigger.submit_event``
does for a yielded ``TriggerEvent``: the ``asset_event`` row, the ``asset_dag_run_queue`` rows of
the consumer DAGs (by asset, alias and name/URI reference), all written through a SQLAlchemy
``Session`` bound to the flush's connection, so they commit, or roll back, with the watermarks and
the de-duplication rows. Airflow's listener hooks (``on_asset_changed``, ``on_asset_event_emitted``)
run only after the commit (`run_callbacks`), never for a transaction that rolled back.

An owner that names no active asset gets no asset event (its event is still recorded and
de-duplicated). A central DB without Airflow's tables records events only (logged once);
`StateStore.emit` refuses an asset's event up front where it can tell (`ready`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from localstate._core.model import asset_name
from localstate._core.rows import EventRow
from localstate._sync.central.asset_mirror import ACTIVE_ASSETS

__all__ = ["NO_ASSET_EVENTS", "AssetEvents", "airflow_importable", "run_callbacks"]

log = logging.getLogger("localstate.sync.asset_events")


def airflow_importable() -> bool:
    """Whether Airflow's models can be imported in this process."""
    try:
        import airflow.assets.manager  # noqa: F401
    except ImportError:
        return False
    return True


def _has_asset_tables(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    return {"asset", "asset_active", "asset_event"} <= names


#: why no asset event can be made (the start of `EventsUnsupported`'s message and of the log)
NO_ASSET_EVENTS = ("an asset watcher's event becomes an Airflow asset event only where the "
                   "process that flushes may write Airflow's tables: the central DB is "
                   "Airflow's metadata DB and Airflow is importable there")


class AssetEvents:
    """Registers the asset events of a flush's new events (see the module docstring)."""

    def __init__(self) -> None:
        #: whether the central DB holds Airflow's asset tables; None: not checked yet
        self._tables: bool | None = None
        #: asset events written so far (for tests and stats)
        self.written = 0

    async def ready(self, engine: AsyncEngine) -> bool:
        """Whether asset events can be made on the DB of `engine` (checked once)."""
        if self._tables is None:
            async with engine.connect() as conn:
                self._tables = await conn.run_sync(_has_asset_tables) and airflow_importable()
        return self._tables

    async def apply(self, conn: AsyncConnection, events: Sequence[EventRow]
                    ) -> tuple[list[int], list[int | None], list[Callable[[], None]]]:
        """Register the asset events of `events` (in their order) on `conn`, inside its
        transaction; the number made per event, the id of the asset event each made (None:
        none, or not known), and the listener callbacks to run after the commit."""
        counts = [0] * len(events)
        ids: list[int | None] = [None] * len(events)
        assets = [(i, name) for i, e in enumerate(events)
                  if (name := asset_name(e.owner)) is not None]
        if not assets:
            return counts, ids, []
        if self._tables is None:
            self._tables = await conn.run_sync(_has_asset_tables) and airflow_importable()
            if not self._tables:
                log.warning(
                    "%s; asset watchers' events are recorded and de-duplicated, but no asset "
                    "event is made", NO_ASSET_EVENTS)
        if not self._tables:
            return counts, ids, []
        callbacks: list[Callable[[], None]] = []

        def register(sync_conn: Connection) -> None:
            from airflow.assets.manager import AssetManager
            from airflow.models.asset import AssetEvent as AssetEventRow
            from airflow.serialization.definitions.assets import SerializedAssetUniqueKey
            from sqlalchemy import insert
            from sqlalchemy.orm import Session

            listening = _listening()
            by_asset: dict[str, list[int]] = {}
            for i, name in assets:
                by_asset.setdefault(name, []).append(i)
            with Session(bind=sync_conn, join_transaction_mode="create_savepoint",
                         expire_on_commit=False) as session:
                for name, indexes in by_asset.items():
                    row = sync_conn.execute(text(
                        f"SELECT a.name, a.uri FROM {ACTIVE_ASSETS} WHERE a.name = :name"),
                        {"name": name}).first()
                    if row is None:
                        continue
                    asset = SerializedAssetUniqueKey(name=row[0], uri=row[1])
                    extras = [{"from_trigger": True, "payload": json.loads(events[i].payload)}
                              for i in indexes]
                    # The first event of the asset goes through Airflow's own path, which
                    # looks the asset up, writes its asset_event row, queues the consumer DAGs
                    # (by asset, alias and name/URI reference; the queue holds one row per
                    # DAG) and prepares the listener calls.
                    first = AssetManager.register_asset_change(
                        asset=asset, extra=extras[0], session=session, callback_sink=callbacks)
                    if first is None:
                        continue
                    counts[indexes[0]] += 1
                    ids[indexes[0]] = getattr(first, "id", None)
                    if len(indexes) == 1:
                        continue
                    # The rest would repeat the same lookups and queue the same DAGs again
                    # (no-ops): ten statements per event. Their rows go in one multi-row
                    # INSERT after the first (so in emit order), with the listener calls
                    # Airflow would have made for each (none when no listener is registered:
                    # Airflow's calls then reach no hook).
                    calls = ([] if not listening else _listener_calls(callbacks, extras[1:]))
                    if calls is None:  # an Airflow whose calls look otherwise: its own path
                        for i, extra in zip(indexes[1:], extras[1:], strict=True):
                            made = AssetManager.register_asset_change(
                                asset=asset, extra=extra, session=session,
                                callback_sink=callbacks)
                            if made is not None:
                                counts[i] += 1
                                ids[i] = getattr(made, "id", None)
                        continue
                    rest = [{"asset_id": first.asset_id, "extra": extra} for extra in extras[1:]]
                    # a Core INSERT of the table (its column defaults, as the ORM's): the
                    # ORM's bulk path copies and inspects every row, a third of a flush's
                    # time in the API server for a batch of thousands
                    table = AssetEventRow.__table__
                    session.flush()  # the first event's row before the rest
                    if sync_conn.dialect.insert_executemany_returning_sort_by_parameter_order:
                        # the ids of the rows, in the order given (the history records them)
                        made_ids = sync_conn.execute(
                            insert(table).returning(table.c.id, sort_by_parameter_order=True),
                            rest).scalars().all()
                        for i, made_id in zip(indexes[1:], made_ids, strict=True):
                            ids[i] = int(made_id)
                    else:
                        sync_conn.execute(insert(table), rest)
                    for i in indexes[1:]:
                        counts[i] += 1
                    callbacks.extend(calls)
                # releases the session's SAVEPOINT: the rows stay in the flush's transaction,
                # which commits (or rolls back) them with the rest; closing without this would
                # roll the savepoint back
                session.commit()

        await conn.run_sync(register)
        self.written += sum(counts)
        return counts, ids, callbacks


def _listening() -> bool:
    """Whether an Airflow listener is registered in this process (Airflow's notifications of
    asset events reach none otherwise)."""
    from airflow.listeners.listener import get_listener_manager

    return bool(get_listener_manager().has_listeners)


def _listener_calls(callbacks: Sequence[Callable[[], None]], extras: Sequence[dict[str, Any]]
                    ) -> list[Callable[[], None]] | None:
    """The listener calls of more events of the asset whose first event's calls `callbacks`
    ends with (``notify_asset_changed``, then ``nofity_asset_event_emitted`` of its event):
    the same two per event, each emitted event with its own ``extra``. None if the calls do
    not look like that (another Airflow version)."""
    import attrs

    if len(callbacks) < 2:
        return None
    changed, emitted = callbacks[-2], callbacks[-1]
    if not isinstance(emitted, functools.partial) or "asset_event" not in emitted.keywords \
            or not attrs.has(type(emitted.keywords["asset_event"])):
        return None
    first = emitted.keywords["asset_event"]
    calls: list[Callable[[], None]] = []
    for extra in extras:
        calls.append(changed)
        calls.append(functools.partial(emitted.func, asset_event=attrs.evolve(first, extra=extra)))
    return calls


def run_callbacks(callbacks: Sequence[Callable[[], Any]]) -> None:
    """Airflow's listener notifications of committed asset events; a failing listener is
    logged, as Airflow does, never undoing the commit."""
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("an Airflow listener failed on an asset event localstate committed")
