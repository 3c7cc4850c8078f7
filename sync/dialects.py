"""The only dialect-specific SQL: a many-row conditional upsert and a many-key lookup.

Both dialects get one statement with a fixed number of parameters however many rows it carries,
so SQLAlchemy compiles it once and no driver parameter limit is ever reached:

* PostgreSQL: the rows travel as one JSON array and are spread out by
  ``jsonb_array_elements`` (measured faster than one array per column through ``unnest``,
  itself 1.7× asyncpg's executemany of the same rows);
* SQLite: the rows travel as one JSON array and are spread out by ``json_each``.

The upsert's ``WHERE`` is the fence: a row replaces the central one only when the central
version is the one the write was based on (``prev_version``), or when the central row was
written by the same local cache file (``writer``) at a version above that base and no higher
than this write's: a write of this file's own chain whose outcome it never recorded (see
`localstate.sync.central_store` for why that is sound). Rows the ``WHERE`` refuses are not
counted in the statement's row count; when it falls short, the caller looks up which rows they
were (the conflicts). The writer travels once per statement (``:writer``), not once per row.
No RETURNING: on the common path (no conflict) decoding one returned row per written row cost
more than the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, Final

import orjson
from sqlalchemy import TextClause, text

from localstate.entry import StateKey
from localstate.sync.schema import STATE_TABLE

__all__ = ["BatchSql", "batch_sql_for"]

_SET: Final = (
    'value = EXCLUDED.value, version = EXCLUDED.version, prev_version = EXCLUDED.prev_version, '
    'updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by, '
    'writer = EXCLUDED.writer'
)
_FENCE: Final = (
    "{t}.version = EXCLUDED.prev_version OR ({t}.writer = EXCLUDED.writer "
    "AND {t}.version > EXCLUDED.prev_version AND {t}.version <= EXCLUDED.version)"
)
_COLUMNS: Final = 'owner, "key", value, version, prev_version, updated_at, updated_by, writer'
# a write with no file behind it (direct mode, compare-and-set on the central DB) clears it
_DIRECT_COLUMNS: Final = 'owner, "key", value, version, prev_version, updated_at, updated_by'

#: one row for the upsert: owner, key, value text, version, prev_version, updated_at, by
UpsertRow = tuple[str, str, str | None, int, int, float, str]


class BatchSql:
    """Statements and parameter packing for one dialect."""

    upsert: TextClause
    select_keys: TextClause
    select_keys_locked: TextClause
    #: one unconditional write (the cache-off path): params owner, key, value, at, by
    direct_upsert: TextClause

    def timestamp(self, ts: float) -> Any:
        """A POSIX time as this dialect's driver takes `updated_at`."""
        raise NotImplementedError

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        raise NotImplementedError


class _PostgresSql(BatchSql):
    # The rows travel as one JSON array, spread out by jsonb_array_elements, as on SQLite.
    # Measured against one array per column through unnest (10,000 rows): 15-20 % less time,
    # since asyncpg checks and encodes every element of seven arrays in Python, while one
    # string goes as it is and PostgreSQL parses it in C. updated_at travels as epoch seconds
    # (to_timestamp): building and encoding 10,000 datetimes cost ~8 ms of such a flush.
    upsert = text(
        f"INSERT INTO {STATE_TABLE} AS t ({_COLUMNS}) "
        "SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, (r->>4)::bigint, "
        "to_timestamp((r->>5)::float8), r->>6, CAST(:writer AS TEXT) "
        "FROM jsonb_array_elements(CAST(:rows AS JSONB)) AS r "
        f'ON CONFLICT (owner, "key") DO UPDATE SET {_SET} WHERE {_FENCE.format(t="t")} '
    )
    _select = (
        f'SELECT t.owner, t."key", t.value, t.version, t.updated_at, t.updated_by, t.writer '
        f"FROM {STATE_TABLE} AS t JOIN unnest(CAST(:owners AS TEXT[]), CAST(:keys AS TEXT[])) "
        'AS k(owner, "key") ON t.owner = k.owner AND t."key" = k."key"'
    )
    select_keys = text(_select)
    select_keys_locked = text(_select + " FOR UPDATE OF t")
    direct_upsert = text(
        f"INSERT INTO {STATE_TABLE} AS t ({_DIRECT_COLUMNS}) "
        "VALUES (:owner, :key, :value, 1, 0, :at, :by) "
        'ON CONFLICT (owner, "key") DO UPDATE SET value = EXCLUDED.value, '
        "version = t.version + 1, prev_version = t.version, "
        "updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by, writer = NULL "
        "RETURNING t.version"
    )

    def timestamp(self, ts: float) -> datetime:
        return datetime.fromtimestamp(ts, tz=timezone.utc)

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        return {"rows": orjson.dumps(rows).decode(), "writer": writer}

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        return {"owners": [k[0] for k in keys], "keys": [k[1] for k in keys]}


class _SqliteSql(BatchSql):
    _cols = ", ".join(f"json_extract(j.value, '$[{i}]')" for i in range(7))
    # "WHERE true" keeps SQLite from reading ON CONFLICT as part of the SELECT's join
    upsert = text(
        f"INSERT INTO {STATE_TABLE} ({_COLUMNS}) SELECT {_cols}, :writer "
        "FROM json_each(:rows) AS j "
        f'WHERE true ON CONFLICT (owner, "key") DO UPDATE SET {_SET} '
        f"WHERE {_FENCE.format(t=STATE_TABLE)} "
    )
    # CROSS JOIN: SQLite keeps the left side as the outer loop, so each key is one PK lookup
    select_keys = text(
        'SELECT t.owner, t."key", t.value, t.version, t.updated_at, t.updated_by, t.writer '
        f"FROM json_each(:keys) AS j CROSS JOIN {STATE_TABLE} AS t "
        "ON t.owner = json_extract(j.value, '$[0]') AND t.\"key\" = json_extract(j.value, '$[1]')"
    )
    # the write lock of BEGIN IMMEDIATE already serializes every writer
    select_keys_locked = select_keys
    direct_upsert = text(
        f"INSERT INTO {STATE_TABLE} ({_DIRECT_COLUMNS}) "
        "VALUES (:owner, :key, :value, 1, 0, :at, :by) "
        'ON CONFLICT (owner, "key") DO UPDATE SET value = excluded.value, '
        f"version = {STATE_TABLE}.version + 1, prev_version = {STATE_TABLE}.version, "
        "updated_at = excluded.updated_at, updated_by = excluded.updated_by, writer = NULL "
        "RETURNING version"
    )

    def timestamp(self, ts: float) -> str:
        # the text form SQLAlchemy's SQLite DateTime reads back
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")

    def upsert_params(self, rows: Sequence[UpsertRow], writer: str | None) -> dict[str, Any]:
        packed = [(o, k, v, ver, prev, self.timestamp(at), by)
                  for o, k, v, ver, prev, at, by in rows]
        return {"rows": orjson.dumps(packed).decode(), "writer": writer}

    def key_params(self, keys: Sequence[StateKey]) -> dict[str, Any]:
        return {"keys": orjson.dumps(keys).decode()}


_BY_DIALECT: Final[dict[str, BatchSql]] = {"postgresql": _PostgresSql(), "sqlite": _SqliteSql()}


def batch_sql_for(dialect: str) -> BatchSql:
    try:
        return _BY_DIALECT[dialect]
    except KeyError:
        raise NotImplementedError(
            f"central DB dialect {dialect!r} is not supported: use postgresql or sqlite"
        ) from None
