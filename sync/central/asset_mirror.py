"""`AssetMirror`: Airflow's own ``asset_state_store`` follows localstate's table for assets.

When the central DB is Airflow's metadata DB, a flushed row whose owner names an asset
(``asset_watcher:<asset name>``) is also written to Airflow's ``asset_state_store`` row of that
asset and key, in the flush's own transaction (`CentralStore.write_batch` calls `apply` before
it commits). So Airflow's readers (a task's ``asset_state_store``, Airflow's UI and REST API)
see the watermark localstate holds, committed with it, without a second writer.

Invariant, after a flush commits: for every row of the batch whose owner names an *active*
asset (an ``asset`` row with its ``asset_active`` row, the assets Airflow's own accessors write
to), ``asset_state_store`` holds the value of the central record the flush settled on (the
write, or the record a conflict kept), or no row when that record is a deletion. Owners that
name no active asset are left alone. The row is stamped as a watcher's write
(``last_updated_by_kind = 'watcher'``, no task fields), as Airflow stamps a watcher trigger's.

Values are JSON text in both tables (Airflow stores ``json.dumps`` of the value), so they are
copied as they are.

The `mode` (the ``asset_mirror`` setting): ``on``, ``off``, or ``auto`` (the default): on when
the central DB holds Airflow's tables, checked once per process on the first flush that has an
asset's row (a database without Airflow's tables pays nothing more).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from sqlalchemy import Connection, inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection

from localstate._core.model import asset_name
from localstate._core.rows import FlushOutcome
from localstate.errors import ConfigError

__all__ = ["ACTIVE_ASSETS", "MIRROR_MODES", "AssetMirror"]

log = logging.getLogger("localstate.sync.asset_mirror")

MIRROR_MODES: Final = ("auto", "on", "off")
_AIRFLOW_TABLES: Final = ("asset", "asset_active", "asset_state_store")

#: Airflow's active assets (what its accessors resolve a name to), as `a`
ACTIVE_ASSETS: Final = "asset a JOIN asset_active aa ON aa.name = a.name AND aa.uri = a.uri"
_ACTIVE_ASSET: Final = f"FROM {ACTIVE_ASSETS} WHERE a.name = :name"
_COLUMNS: Final = ("asset_id, key, value, updated_at, last_updated_by_kind, "
                   "last_updated_by_dag_id, last_updated_by_run_id, last_updated_by_task_id, "
                   "last_updated_by_map_index")
_INSERT: Final = (f"INSERT INTO asset_state_store ({_COLUMNS}) SELECT a.id, :key, :value, :at, "
                  f"'watcher', NULL, NULL, NULL, NULL {_ACTIVE_ASSET}")
_WATCHER: Final = ("last_updated_by_kind = 'watcher', last_updated_by_dag_id = NULL, "
                   "last_updated_by_run_id = NULL, last_updated_by_task_id = NULL, "
                   "last_updated_by_map_index = NULL")
#: PostgreSQL and SQLite (3.24+; the WHERE before it keeps SQLite's parser from reading the
#: ON of ON CONFLICT as a join's)
_UPSERT: Final = text(f"{_INSERT} ON CONFLICT (asset_id, key) DO UPDATE SET "
                      f"value = excluded.value, updated_at = excluded.updated_at, {_WATCHER}")
#: MySQL: the parameters again, not VALUES() (deprecated in MySQL 8)
_UPSERT_MYSQL: Final = text(f"{_INSERT} ON DUPLICATE KEY UPDATE value = :value, "
                            f"updated_at = :at, {_WATCHER}")
_DELETE: Final = text("DELETE FROM asset_state_store WHERE key = :key AND asset_id IN "
                      f"(SELECT a.id {_ACTIVE_ASSET})")


def _has_airflow_tables(conn: Connection) -> bool:
    names = set(inspect(conn).get_table_names())
    return all(t in names for t in _AIRFLOW_TABLES)


class AssetMirror:
    """Writes the asset rows of each flush to Airflow's ``asset_state_store`` (see module)."""

    def __init__(self, mode: str = "auto") -> None:
        if mode not in MIRROR_MODES:
            raise ConfigError(f"asset_mirror must be one of {', '.join(MIRROR_MODES)}, "
                              f"not {mode!r}")
        self.mode = mode
        #: whether the central DB holds Airflow's tables; None: not checked yet
        self._active: bool | None = {"on": True, "off": False}.get(mode)
        #: asset rows written and deleted (for tests and stats)
        self.rows_mirrored = 0

    async def apply(self, conn: AsyncConnection, outcomes: Sequence[FlushOutcome],
                    timestamp: Callable[[float], Any]) -> None:
        """Mirror the asset rows of `outcomes` on `conn`, inside the flush's transaction.

        `timestamp` turns a POSIX time into what this dialect's driver takes.
        """
        if self._active is False:
            return
        upserts: list[dict[str, Any]] = []
        deletes: list[dict[str, Any]] = []
        for o in outcomes:
            c = o.central
            name = None if c is None else asset_name(c.owner)
            if c is None or name is None:
                continue
            if c.data is None:
                deletes.append({"name": name, "key": c.key})
            else:
                upserts.append({"name": name, "key": c.key, "value": c.data,
                                "at": timestamp(c.updated_at)})
        if not upserts and not deletes:
            return
        if self._active is None:
            self._active = await conn.run_sync(_has_airflow_tables)
            log.info("asset_mirror=auto: the central DB %s Airflow's asset_state_store; "
                     "asset watermarks are %s", "holds" if self._active else "lacks",
                     "mirrored there" if self._active else "not mirrored")
            if not self._active:
                return
        if upserts:
            mysql = conn.dialect.name in ("mysql", "mariadb")
            await conn.execute(_UPSERT_MYSQL if mysql else _UPSERT, upserts)
        if deletes:
            await conn.execute(_DELETE, deletes)
        self.rows_mirrored += len(upserts) + len(deletes)
